"""Shared fixtures: a small synthetic corpus and a tiny target trained on it in seconds."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from src.corpus import synthetic_text

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
PROMPT = "the cat "


def compose_cfg(corpus_path, cache_dir, *overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=[
            "model=tiny", "train=quick", f"data.path={corpus_path}", f"data.cache_dir={cache_dir}",
            f"prompt='{PROMPT}'", "n_chars=64", "timing.pairs=1", "timing.cost_reps=2", *overrides])


@pytest.fixture(scope="session")
def corpus_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text(synthetic_text(60_000), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def tiny(corpus_path, cache_dir):
    """(cfg, corpus, TrainedTarget): trained once per test session (a few seconds)."""
    from src.trial import load_target
    cfg = compose_cfg(corpus_path, cache_dir)
    corpus, target = load_target(cfg, progress=False)
    return cfg, corpus, target


@pytest.fixture(scope="session")
def drafts(tiny):
    """name -> draft, for every draft config shipped in conf/draft/."""
    from src.trial import build_draft
    cfg, corpus, target = tiny
    out = {}
    for name in sorted(p.stem for p in (Path(CONF_DIR) / "draft").glob("*.yaml")):
        dcfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, f"draft={name}")
        out[name] = build_draft(dcfg, target, corpus)
    return out


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
