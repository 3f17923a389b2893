"""A trial under an adaptive draft-length policy, end to end on the tiny model (src/trial/policies.py).

The cost policy times its cost profile inside the host's timing lock before the counter run
(a trial of the `policies` sweep once crashed there, on the lock, before any test ran this path),
caches it per host, and a second trial with the same spec reads the cached profile: its counters
are then identical. The heuristic policy needs no profile and writes none.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from src.trial.spec import trial_spec
from src.trial.trial import run_trial
from tests.conftest import compose_cfg

K = 4
OVERRIDES = {"cost": ["policy.calibration_seqs=4", "policy.calibration_chars=40", "policy.profile_rounds=2"],
             "heuristic": ["policy.start=1"]}


@pytest.fixture
def trial_cfg(tiny, tmp_path):
    """policy -> a bigram trial's config under it, in a cache folder of the test's own whose
    models/ is the session's (the tiny target), so its profiles are the test's alone."""
    cfg, _, _ = tiny
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(Path(cfg.data.cache_dir) / "models", target_is_directory=True)
    return lambda policy: compose_cfg(cfg.data.path, cache, "draft=bigram", f"k={K}", f"policy={policy}",
                                      "timing.target_width=null", *OVERRIDES[policy])


def test_a_cost_policy_trial_times_its_profile_once_and_logs_it(trial_cfg):
    cfg = trial_cfg("cost")
    profiles_dir = Path(cfg.data.cache_dir) / "profiles"
    spec = trial_spec(cfg)
    first = run_trial(spec, progress=False).metrics
    profiles = list(profiles_dir.glob("*.json"))
    assert len(profiles) == 1
    profile = json.loads(profiles[0].read_text())
    assert set(profile) == {"c", "b", "o"} and profile["c"] > 0 and profile["b"] >= 0
    assert {key: first[f"policy_{key}"] for key in profile} == profile
    assert 1 <= first["drafted_mean"] <= K
    assert sum(first[f"drafted_len_{j}"] for j in range(1, K + 1)) == pytest.approx(1.0)
    assert first["proposed"] == pytest.approx(first["drafted_mean"] * first["draft_calls"])
    second = run_trial(spec, progress=False).metrics
    assert len(list(profiles_dir.glob("*.json"))) == 1          # read, not timed again
    for key in ("target_passes", "proposed", "accepted", "drafted_mean", "policy_c", "policy_b"):
        assert second[key] == first[key], key


def test_a_heuristic_policy_trial_writes_no_profile(trial_cfg):
    cfg = trial_cfg("heuristic")
    m = run_trial(trial_spec(cfg), progress=False).metrics
    assert not (Path(cfg.data.cache_dir) / "profiles").exists()
    assert 1 <= m["drafted_mean"] <= K and m["drafted_len_1"] > 0          # it starts at 1
