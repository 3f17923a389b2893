"""A cell's identity is the trial's resolved spec (src/sweep/resume.py: cell_key), the same in every
checkout and whatever sweep names it. The sweeps that resume on it: tests/sweep/test_sweep.py
(resume, and reuse across two sweeps of other names), tests/sweep/test_resume_versions.py (the
compute version). Mutations caught (each tried): the repository's path left in the key (another
checkout makes another cell), the workload's prompts left out of it (an edited file is the same
cell).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from src.paths import REPO
from src.sweep import resume
from src.sweep.resume import cell_key
from src.trial.spec import trial_spec
from tests.conftest import compose_cfg


def key(cfg, *overrides) -> str:
    return cell_key(trial_spec(compose_cfg(cfg.data.path, cfg.data.cache_dir, *overrides)))


def test_configs_that_resolve_to_the_same_spec_are_one_cell(tiny):
    cfg, _, _ = tiny
    base = key(cfg)
    # where it is logged, the sweep that asks for it, and a setting of a check that is off: not the cell
    for same in (["sweep_name=another"], ["tracking.uri=sqlite:///elsewhere.db"], ["resume=false"],
                 ["exactness.samples=123"]):
        assert key(cfg, *same) == base, same
    # what the trial computes with: each another cell
    others = {key(cfg, *o) for o in (["k=5"], ["seed=1"], ["temperature=0.5"], ["engine=compiled"],
                                      ["draft=ngram"], ["exactness.enabled=true"])}
    assert len(others) == 6 and base not in others


def test_an_edited_prompt_file_is_another_cell(tiny, tmp_path):
    cfg, _, _ = tiny
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "To be, or ", "category": "a"}\n')
    first = key(cfg, "workload=file", f"workload.path={prompts}")
    prompts.write_text('{"prompt": "Not to be ", "category": "a"}\n')
    assert key(cfg, "workload=file", f"workload.path={prompts}") != first
    prompts.write_text('{"prompt": "To be, or ", "category": "a"}\n')
    assert key(cfg, "workload=file", f"workload.path={prompts}") == first


def test_two_checkouts_of_one_commit_key_a_cell_alike(tiny, monkeypatch):
    """A spec's paths are absolute; inside the repository they enter the key relative to it."""
    cfg, _, _ = tiny
    spec = trial_spec(compose_cfg(cfg.data.path, cfg.data.cache_dir))

    def at(root: Path):
        data = dataclasses.replace(spec.target.data, path=root / "corpora" / "my.txt", cache_dir=root / "data")
        return dataclasses.replace(spec, target=dataclasses.replace(spec.target, data=data))
    here = cell_key(at(REPO))
    monkeypatch.setattr(resume, "REPO", Path("/elsewhere/checkout"))
    assert cell_key(at(Path("/elsewhere/checkout"))) == here
    assert cell_key(at(Path("/yet/another"))) != here   # outside the checkout: the path is the file
