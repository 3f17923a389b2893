"""The shipped default target (src/engine/models/weights/): served from git instead of trained, only
when its bytes are the ones src/engine/models/train.py records (SHIPPED_TARGETS, tracked source), its
recipe agrees and its weights give their recorded loss on the check slice; its recipe is the
default config's, and `make retrain-default` (src/bench/retrain.py) retrains and compares. A
cached checkpoint that does not give its recorded loss, or cannot be read, is refused before the
store."""
from __future__ import annotations

import json
import logging
from dataclasses import asdict

import pytest
import torch

from src.bench import retrain
from src.bench.retrain import TOLERANCE, ship
from src.engine.models import train as train_module
from src.engine.atomic import file_sha256, sealed
from src.engine.models.train import SHIPPED, SHIPPED_TARGETS, TrainConfig, cache_key, get_target, recipe, shipped_recipes
from src.trial.spec import trial_spec
from tests.conftest import compose_cfg


def shipped_entry(cfg, corpus, target) -> dict:
    spec = trial_spec(cfg).target
    ckpt = torch.load(target.path, map_location="cpu", weights_only=True)
    return recipe(target.key, corpus.sha256, ckpt["model_config"], spec.train, spec.train_seed, ckpt,
                  file_sha256(target.path))


def trusted(monkeypatch, entry: dict) -> None:
    """SHIPPED_TARGETS (tracked source) with `entry`'s key: what `--ship` tells one to write there."""
    monkeypatch.setitem(train_module.SHIPPED_TARGETS, entry["key"], {k: entry[k] for k in ("sha256", "val_loss",
                                                                                          "check_loss")})


def test_a_shipped_target_is_copied_instead_of_trained(tiny, tmp_path, monkeypatch, caplog):
    cfg, corpus, target = tiny
    spec = trial_spec(cfg).target
    weights = tmp_path / "weights"
    entry = shipped_entry(cfg, corpus, target)
    ship(weights, entry, target.path)
    calls = []
    monkeypatch.setattr(train_module, "train", lambda model, *a, **k: calls.append(1) or model)   # counted, not run

    def get(cache, shipped):
        return get_target(corpus, spec.model, spec.train, spec.train_seed, tmp_path / cache, progress=False,
                          shipped=shipped)

    got = get("a0", weights)                # not in SHIPPED_TARGETS (tracked source): its recipe alone is not trusted
    assert calls == [1] and got.key == target.key
    trusted(monkeypatch, entry)
    got = get("a", weights)
    assert calls == [1] and got.sha256 == target.sha256 and got.key == target.key and sealed(got.path)
    get("b", None)                          # control: without the shipped folder the same call trains
    assert calls == [1, 1]


def damaged(path, scale: float = 3.0) -> None:
    """The checkpoint at `path` with one weight matrix scaled: loads, runs, and is not the target."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    name = next(n for n, w in ckpt["state_dict"].items() if w.dim() == 2 and "emb" not in n)
    ckpt["state_dict"][name] = ckpt["state_dict"][name] * scale
    torch.save(ckpt, path)


@pytest.mark.parametrize("edit", ["weights and recipe's sha256", "recipe's val_loss", "recorded check loss"])
def test_a_shipped_target_that_is_not_what_it_claims_is_trained_instead(tiny, tmp_path, monkeypatch, caplog, edit):
    """The issue's case: damaged weights with recipe.json's sha256 edited to match them (the hash
    beside the file); a recipe whose validation loss was edited; and (the loss check alone) weights
    whose recorded check loss is not theirs. Each is skipped with a warning naming why, and the
    target is trained: never served under its key."""
    cfg, corpus, target = tiny
    spec = trial_spec(cfg).target
    weights = tmp_path / "weights"
    entry = shipped_entry(cfg, corpus, target)
    trusted(monkeypatch, entry)
    shipped_file = weights / f"target-{target.key}.pt"
    if edit == "weights and recipe's sha256":
        ship(weights, entry, target.path)
        damaged(shipped_file)
        ship(weights, {**entry, "sha256": file_sha256(shipped_file)}, shipped_file)
        why = "fails its checksum (its sha256 is not the one src/engine/models/train.py records)"
    elif edit == "recipe's val_loss":
        ship(weights, {**entry, "val_loss": entry["val_loss"] - 0.3}, target.path)
        why = "recipe.json disagrees with src/engine/models/train.py"
    else:
        ship(weights, entry, target.path)
        monkeypatch.setitem(train_module.SHIPPED_TARGETS[target.key], "check_loss", entry["check_loss"] + 0.01)
        why = "its loss on the check slice is"
    calls = []
    monkeypatch.setattr(train_module, "train", lambda model, *a, **k: calls.append(1) or model)   # counted, not run
    with caplog.at_level(logging.WARNING, logger="src.engine.models.train"):
        got = get_target(corpus, spec.model, spec.train, spec.train_seed, tmp_path / "cache", progress=False,
                         shipped=weights)
    assert calls == [1] and why in caplog.text and "training it instead" in caplog.text
    assert got.sha256 != file_sha256(shipped_file) or edit != "weights and recipe's sha256"


def cached_copy(tiny, cache):
    """(the tiny target's checkpoint copied and sealed into the model cache `cache`, a trial spec on that cache)."""
    import shutil
    from src.engine.atomic import seal
    cfg, _, target = tiny
    (cache / "models").mkdir(parents=True)
    path = cache / "models" / target.path.name
    shutil.copyfile(target.path, path)
    seal(path)
    return path, trial_spec(compose_cfg(cfg.data.path, cache))


def test_a_cached_checkpoint_that_does_not_give_its_recorded_loss_is_refused_before_the_store(tiny, tmp_path):
    """A cached checkpoint damaged and resealed (its sidecar rewritten: the checksum passes) is refused
    by its loss on the check slice, in the checks that run before the store (and on load); a cache
    entry of the shipped key with other bytes and no record of its own is refused too. The same
    checkpoint undamaged passes (the control)."""
    from src.engine.atomic import seal
    from src.engine.errors import SpecsweepError
    from src.trial.checks import check_cached_checkpoints
    cfg, corpus, target = tiny
    path, spec = cached_copy(tiny, tmp_path / "cache")
    check_cached_checkpoints(spec, corpus)                     # the control: its own weights pass
    damaged(path)
    seal(path)
    with pytest.raises(SpecsweepError, match="its loss on the check slice is .* its record says"):
        check_cached_checkpoints(spec, corpus)
    with pytest.raises(SpecsweepError, match="its loss on the check slice"):
        get_target(corpus, spec.target.model, spec.target.train, spec.target.train_seed, path.parent.parent,
                   progress=False)
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    del ckpt["check_loss"]                                   # as the shipped file's payload: no record of its own
    torch.save(ckpt, path)
    seal(path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(train_module.SHIPPED_TARGETS, target.key, {"sha256": "0" * 64, "val_loss": 0.0, "check_loss": 0.0})
        with pytest.raises(SpecsweepError, match="neither the shipped bytes nor a recorded check loss"):
            check_cached_checkpoints(spec, corpus)


def test_an_unreadable_cached_or_shipped_checkpoint_is_refused_in_one_line(tiny, tmp_path, monkeypatch):
    """A cached checkpoint, or the shipped one a missing cache entry would be copied from, that
    cannot be read (PermissionError) is refused before the store, not a traceback. As root chmod
    denies nothing: the denial is simulated at open."""
    import builtins
    import shutil
    from src.engine.errors import SpecsweepError
    from src.trial.checks import check_cached_checkpoints
    cfg, corpus, target = tiny
    path, spec = cached_copy(tiny, tmp_path / "cache")
    weights = tmp_path / "weights"
    weights.mkdir()
    shutil.copyfile(target.path, weights / target.path.name)
    real_open = builtins.open

    def denied(file, *args, **kwargs):
        if str(file) in (str(path), str(weights / target.path.name)):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", denied)
    with pytest.raises(SpecsweepError, match="cannot be read \\(Permission denied\\)"):
        check_cached_checkpoints(spec, corpus)
    path.unlink()                                              # no cache entry: the shipped file would be copied
    monkeypatch.setattr("src.trial.checks.check_shipped_readable",
                        lambda name: train_module.check_shipped_readable(name, weights))
    with pytest.raises(SpecsweepError, match="the shipped target .* cannot be read \\(Permission denied\\)"):
        check_cached_checkpoints(spec, corpus)


def test_the_shipped_default_target_is_the_default_configs_target():
    """The recipe is the default config's target (a changed conf/train or conf/model must be
    retrained and shipped: `make retrain-default ARGS=--ship`), its key is the cache key of
    that recipe, and the shipped bytes are the recipe's."""
    with_defaults = trial_spec(compose_default()).target
    entries = shipped_recipes()
    assert len(entries) == 1, "ship one target: the default config's"
    (key, entry), = entries.items()
    assert entry["train"] == asdict(with_defaults.train), "conf/train/default.yaml changed: retrain and ship"
    assert {k: v for k, v in entry["model"].items() if k != "vocab_size"} == with_defaults.model, \
        "conf/model/small.yaml changed: retrain and ship"
    assert entry["seed"] == with_defaults.train_seed
    assert cache_key(entry["corpus_sha256"], entry["model"], TrainConfig(**entry["train"]), entry["seed"]) == key
    path = SHIPPED / f"target-{key}.pt"
    known = SHIPPED_TARGETS[key]                                # the record in tracked source
    assert file_sha256(path) == entry["sha256"] == known["sha256"], "ship it again, or update SHIPPED_TARGETS"
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    assert ckpt["model_config"] == entry["model"] and ckpt["val_loss"] == entry["val_loss"] == known["val_loss"]
    assert entry["check_loss"] == known["check_loss"]


def test_the_shipped_default_target_gives_its_recorded_loss_on_the_check_slice():
    """Recomputed from the shipped file on the default corpus, where this machine has it cached (the
    tests never fetch it)."""
    from src.engine.models.corpus import load_corpus
    from src.engine.models.train import CHECK_TOL, check_loss, model_from_checkpoint
    from src.paths import REPO
    if not (REPO / "data" / "shakespeare.txt").is_file():
        pytest.skip("the default corpus is not cached here (data/shakespeare.txt): the tests never fetch it")
    corpus = load_corpus(None, REPO / "data", "shakespeare")
    (key, entry), = shipped_recipes().items()
    assert corpus.sha256 == entry["corpus_sha256"]
    model, tok = model_from_checkpoint(torch.load(SHIPPED / f"target-{key}.pt", map_location="cpu", weights_only=True))
    assert abs(check_loss(model, tok, corpus, TrainConfig(**entry["train"])) - SHIPPED_TARGETS[key]["check_loss"]) \
        <= CHECK_TOL


def compose_default():
    from hydra import compose, initialize_config_dir
    from src.paths import CONF_DIR
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config")


@pytest.mark.slow
def test_retrain_reproduces_a_shipped_target_and_flags_one_that_its_recipe_does_not_make(
        tiny, tmp_path, capsys):
    cfg, _, _ = tiny
    weights = tmp_path / "weights"
    args = ["--weights", str(weights), "model=tiny", "train=quick", f"data.path={cfg.data.path}",
            f"data.cache_dir={cfg.data.cache_dir}"]
    assert retrain.main(args) == 1                         # nothing shipped for this key yet
    assert "no shipped checkpoint has this key" in capsys.readouterr().out
    assert retrain.main(["--ship", *args]) == 0
    capsys.readouterr()
    assert retrain.main(args) == 0                         # the same CPU and torch: the same weights
    out = capsys.readouterr().out
    assert "weights identical" in out and "\nreproduced" in out
    recipe_file = weights / "recipe.json"
    entries = json.loads(recipe_file.read_text())
    entries[0]["val_loss"] += 2 * TOLERANCE                # a recipe whose model is not what it makes here
    recipe_file.write_text(json.dumps(entries))
    assert retrain.main(args) == 1
    assert "NOT reproduced" in capsys.readouterr().out


def test_retrain_refuses_a_bad_override_in_one_line_before_training(tmp_path, capsys):
    assert retrain.main(["--weights", str(tmp_path), "model=nosuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown model 'nosuch'")
    assert not any(tmp_path.iterdir())
