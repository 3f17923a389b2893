"""Retrain a shipped target and compare (printed; exit 1 if it does not reproduce): `make retrain-default`.

The default target ships in git (src/engine/models/weights/, with recipe.json), so a fresh clone's
first trial does not wait 10-25 minutes for training. This command checks that the shipped
file is what its recipe makes: it trains the target of the config (the default one, or the
overrides given) into a temporary folder, with every core, never reading the shipped copy or
this host's cache, and prints the shipped and the retrained checkpoint side by side: cache key,
sha256, validation loss (nats/char over the whole validation split), training time, and the
weights' largest absolute difference.

It passes (exit 0) when the validation losses differ by at most TOLERANCE nats/char; it also
prints the weights' largest difference. The same CPU and torch build give identical weights
(the files differ anyway: each records its training time); another CPU's float arithmetic
gives a slightly different model of the same quality, hence a tolerance on the loss. Without a
shipped checkpoint for the config's key (another corpus, model or schedule), it says so and
exits 1.

    python -m src.bench.retrain                          # the default target: 10-25 min on 2 cores
    python -m src.bench.retrain --ship                   # and write the retrained one into the weights folder
                                                         # (it prints the SHIPPED_TARGETS entry to put in src/engine/models/train.py)
    python -m src.bench.retrain model=tiny train=quick data=synthetic --weights DIR --ship
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from ..engine.atomic import file_sha256, write_bytes, write_text
from ..door import ArgParser, command, compose, refuse
from ..engine.models.train import SHIPPED, get_target, recipe, shipped_entry, shipped_recipes
from ..trial.load import load_corpus_of
from ..trial.spec import is_folder_model, target_spec

TOLERANCE = 0.02   # nats/char: a retrained model within this of the shipped one's validation loss reproduces it


def ship(folder: Path, entry: dict, checkpoint: Path) -> None:
    """Write `checkpoint` into `folder` as target-<key>.pt and its recipe `entry` into recipe.json
    (replacing the entry of the same key)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_bytes(folder / f"target-{entry['key']}.pt", checkpoint.read_bytes())   # the file first, its recipe last
    entries = {**shipped_recipes(folder), entry["key"]: entry}
    write_text(folder / "recipe.json", json.dumps(sorted(entries.values(), key=lambda e: e["key"]), indent=1) + "\n")


def weight_difference(a: Path, b: Path) -> float:
    """The largest absolute difference between two checkpoints' weights (0.0: identical; the
    files' bytes differ anyway, by their recorded training time)."""
    sa, sb = (torch.load(p, map_location="cpu", weights_only=True)["state_dict"] for p in (a, b))
    if sa.keys() != sb.keys() or any(sa[n].shape != sb[n].shape for n in sa):
        return float("inf")
    return max(float((sa[n].float() - sb[n].float()).abs().max()) for n in sa)


def compare(shipped: dict | None, retrained: dict, max_diff: float | None = None) -> tuple[list[str], bool]:
    """The side-by-side lines, and whether the retrained target reproduces the shipped one
    (`max_diff`: the weights' largest absolute difference, None if the shipped file is missing)."""
    rows = [("", "shipped", "retrained")]
    if shipped is None:
        rows.append(("key", "(none shipped)", retrained["key"]))
    for name, fmt in (("key", "{}"), ("sha256", "{:.16}"), ("val_loss", "{:.4f}"), ("train_seconds", "{:.0f}")):
        if shipped is not None:
            rows.append((name, fmt.format(shipped[name]), fmt.format(retrained[name])))
    width = max(len(r[1]) for r in rows) + 2
    lines = [f"{a:<14}{b:<{width}}{c}" for a, b, c in rows]
    if shipped is None:
        return lines + ["no shipped checkpoint has this key: nothing to compare (--ship writes one)"], False
    diff = retrained["val_loss"] - shipped["val_loss"]
    ok = abs(diff) <= TOLERANCE and max_diff is not None
    weights = ("missing" if max_diff is None else "identical" if max_diff == 0 else
               f"differ by up to {max_diff:.3g} (another CPU's float arithmetic, or another torch build)")
    lines.append(f"validation loss differs by {diff:+.4f} nats/char (tolerance {TOLERANCE}); weights {weights}")
    lines.append("reproduced" if ok else "NOT reproduced: the shipped checkpoint is not what its recipe makes here")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    ap = ArgParser(prog="python -m src.bench.retrain", description=__doc__.splitlines()[0])
    ap.add_argument("--weights", type=Path, default=SHIPPED, help="the folder of shipped checkpoints and recipe.json")
    ap.add_argument("--ship", action="store_true", help="write the retrained checkpoint and its recipe into --weights")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE overrides of the main config (conf/config.yaml)")
    args = ap.parse_args(argv)
    return command(lambda: retrain(args.weights, args.ship, args.overrides))


def retrain(weights: Path, ship_it: bool, overrides: list[str]) -> int:
    """Retrain the config's target in a folder of its own, compare it with the shipped one (1 when it
    does not reproduce it), and with `ship_it` write it into `weights`."""
    spec = target_spec(compose(overrides))
    corpus = load_corpus_of(spec.data)
    if is_folder_model(spec.model):
        refuse("model=hf is not trained here: nothing to retrain")
    with tempfile.TemporaryDirectory(prefix="retrain-") as tmp:
        t0 = time.perf_counter()
        target = get_target(corpus, spec.model, spec.train, spec.train_seed, tmp, progress=True, shipped=None)
        ckpt = torch.load(target.path, map_location="cpu", weights_only=True)
        retrained = recipe(target.key, corpus.sha256, ckpt["model_config"], spec.train, spec.train_seed, ckpt,
                           file_sha256(target.path))
        print(f"retrained target {target.key} in {time.perf_counter() - t0:.0f} s")
        shipped = shipped_recipes(weights).get(target.key)
        shipped_file = weights / target.path.name
        max_diff = weight_difference(shipped_file, target.path) if shipped and shipped_file.is_file() else None
        lines, ok = compare(shipped, retrained, max_diff)
        print("\n".join(lines))
        if ship_it:
            ship(weights, retrained, target.path)
            print(f"shipped: {weights / ('target-' + target.key + '.pt')} and its recipe; it is served only once "
                  f"SHIPPED_TARGETS in src/engine/models/train.py has this entry:\n    {shipped_entry(retrained)}")
            return 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
