"""Write one of the tool's targets as a transformers checkpoint: `make export ARGS="DIR [overrides]"`.

    python -m src.export exports/default                         # the default target (shipped: seconds)
    python -m src.export exports/tiny model=tiny train=quick data=synthetic

The target of the config (trained first if this host has not, like any trial's) is written into
DIR, a new or empty folder: GPT-2 weights computing the same logits, a character-level tokenizer
transformers loads (`AutoTokenizer.from_pretrained(DIR)`), and specsweep.json naming the target's
cache key. `python -m src.run model=hf model.path=DIR ...` then runs it as a model from a folder,
with the same counters as the built-in model for the same seed (tests/engine/huggingface/test_folder_model.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

from .door import ArgParser, command, compose, refuse
from .engine.errors import SpecsweepError
from .engine.huggingface.checkpoint import export_checkpoint
from .engine.locks import check_creatable
from .trial.load import load_target
from .trial.spec import is_folder_model, repo_path, target_spec


def main(argv: list[str] | None = None) -> int:
    ap = ArgParser(prog="python -m src.export", description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="a new or empty folder for the checkpoint")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE overrides of the main config (which target)")
    args = ap.parse_args(argv)
    return command(lambda: export(args.folder, args.overrides))


def export(where: str, overrides: list[str]) -> None:
    folder = repo_path(where)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        refuse(f"{folder} exists and is not an empty folder: export into a new one")
    try:   # before the target is loaded or trained: a folder under a file, or where nothing can be made (/proc)
        check_creatable(folder, "the export folder")
    except SpecsweepError as e:
        refuse(f"{e}: export into a folder that can be created")
    spec = target_spec(compose(overrides))
    if is_folder_model(spec.model):
        refuse("model=hf is a checkpoint already: export the tool's own targets (model=small, tiny, medium)")
    _, target = load_target(spec)
    export_checkpoint(target.model, target.tokenizer, folder, {"target_key": target.key, "val_loss": target.val_loss})
    print(f"exported target {target.key} ({target.model.n_params()} params, {target.tokenizer.vocab_size} chars) "
          f"to {folder}\nrun it: python -m src.run model=hf model.path={Path(where)}")


if __name__ == "__main__":
    sys.exit(main())
