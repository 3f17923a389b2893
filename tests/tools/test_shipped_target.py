"""The shipped default target (src/engine/models/weights/): served from git instead of trained, only
when its bytes are its recipe's, its recipe is the default config's, and `make retrain-default`
(src/bench/retrain.py) retrains and compares."""
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
from src.engine.models.train import SHIPPED, TrainConfig, cache_key, get_target, recipe, shipped_recipes
from src.trial.spec import trial_spec


def shipped_entry(cfg, corpus, target) -> dict:
    spec = trial_spec(cfg).target
    ckpt = torch.load(target.path, map_location="cpu", weights_only=True)
    return recipe(target.key, corpus.sha256, ckpt["model_config"], spec.train, spec.train_seed, ckpt,
                  file_sha256(target.path))


def test_a_shipped_target_is_copied_instead_of_trained(tiny, tmp_path, monkeypatch, caplog):
    cfg, corpus, target = tiny
    spec = trial_spec(cfg).target
    weights = tmp_path / "weights"
    ship(weights, shipped_entry(cfg, corpus, target), target.path)
    calls = []
    real_train = train_module.train
    monkeypatch.setattr(train_module, "train", lambda *a, **k: calls.append(1) or real_train(*a, **k))

    def get(cache, shipped):
        return get_target(corpus, spec.model, spec.train, spec.train_seed, tmp_path / cache, progress=False,
                          shipped=shipped)

    got = get("a", weights)
    assert calls == [] and got.sha256 == target.sha256 and got.key == target.key and sealed(got.path)
    get("b", None)                          # control: without the shipped folder the same call trains
    assert calls == [1]
    shipped_file = weights / f"target-{target.key}.pt"
    data = bytearray(shipped_file.read_bytes())
    data[len(data) // 2] ^= 0xFF            # a shipped file that is not its recipe's bytes is not served
    shipped_file.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="src.engine.models.train"):
        trained = get("c", weights)
    assert calls == [1, 1] and "fails its checksum" in caplog.text and sealed(trained.path)


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
    assert file_sha256(path) == entry["sha256"]
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    assert ckpt["model_config"] == entry["model"] and ckpt["val_loss"] == entry["val_loss"]


def compose_default():
    from hydra import compose, initialize_config_dir
    from src.paths import CONF_DIR
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config")


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
    with pytest.raises(SystemExit) as e:
        retrain.main(["--weights", str(tmp_path), "model=nosuch"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown model 'nosuch'")
    assert not any(tmp_path.iterdir())
