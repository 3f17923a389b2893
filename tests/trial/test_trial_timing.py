"""A real trial's timing on the tiny model (src/trial/trial.py): adaptive pairs and cost rounds end
to end, counted and consistent; bad timing options refused when the spec is built."""
from __future__ import annotations

import pytest

from src.engine.errors import SpecsweepError
from src.engine.measuring.timing import WIDTH
from src.trial.spec import trial_spec
from src.trial.trial import run_trial


def pairs_csv_rows(timing) -> list[str]:
    from src.sweep.tracking import pairs_csv
    return pairs_csv(timing).strip().splitlines()[1:]


def test_adaptive_trial_end_to_end(tiny):
    """A real trial with adaptive pairs (caps kept small): the counts and metrics agree with each
    other, pairs.csv has one row per pair, and the rendered line says how it stopped."""
    from src.trial.render import trial_block
    from tests.conftest import compose_cfg
    cfg, _, _ = tiny
    trial_cfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=bigram", "k=2", "timing.pairs=2",
                            "timing.target_width=0.5", "timing.max_pairs=6", "timing.max_seconds=20")
    r = run_trial(trial_spec(trial_cfg), progress=False)
    m = r.metrics
    n = m["pairs_used"]
    assert 2 <= n <= 6 and n == len(r.timing.ratios) == len(pairs_csv_rows(r.timing))
    assert m["width_reached"] == int(r.timing.stop == WIDTH)
    if m["width_reached"]:
        assert n % 2 == 0 and m["interval_rel_width"] <= 0.5 and m["speedup_interval_confidence"] >= 0.95
    else:
        assert n == 6 or m["timed_s"] >= 20
    assert m["speedup_min"] <= m["speedup_lo"] <= m["speedup_median"] <= m["speedup_hi"] <= m["speedup_max"]
    assert all(key in m for key in ("target_pass_us", "verify_pass_us", "draft_char_us", "c"))
    assert m["c"] == pytest.approx(m["draft_char_us"] / m["target_pass_us"])
    text = trial_block(trial_spec(trial_cfg), r)
    assert f"over {n} pairs (" in text and "interval for the median; " in text
    assert ("width reached" in text) == bool(m["width_reached"])


def test_bad_timing_options_are_refused_before_any_work(tmp_path):
    from tests.conftest import compose_cfg
    cfg = compose_cfg(tmp_path / "missing.txt", tmp_path, "timing.confidence=1.5")
    with pytest.raises(SpecsweepError, match="timing.confidence must be a number in"):
        trial_spec(cfg)
    cfg = compose_cfg(tmp_path / "missing.txt", tmp_path, "timing.target_width=0.1", "timing.max_pairs=null",
                      "timing.max_seconds=null")
    with pytest.raises(SpecsweepError, match="needs a cap"):
        trial_spec(cfg)
    trial_spec(compose_cfg(tmp_path / "missing.txt", tmp_path, "timing.target_width=null", "timing.max_pairs=null",
                           "timing.max_seconds=null"))  # fixed pairs need no cap


def test_adaptive_cost_rounds_in_a_trial(tiny):
    """A real trial with adaptive cost rounds (a width no real machine reaches, and a 9-round
    cap): it logs the rounds it took and why it stopped, consistently; with cost_width null,
    exactly 7 rounds and no width_reached flag."""
    from src.trial.render import trial_block
    from tests.conftest import compose_cfg
    cfg, corpus, target = tiny
    for width, expect in [(1e-6, 0), (10.0, 1)]:
        trial_cfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=bigram", "k=2",
                                f"timing.cost_width={width}", "timing.cost_max_rounds=9", "timing.cost_max_seconds=null")
        r = run_trial(trial_spec(trial_cfg), progress=False, loaded=(corpus, target))
        m = r.metrics
        assert m["cost_width_reached"] == expect
        assert m["cost_rounds"] == (9 if expect == 0 else 7)
        assert (m["cost_pass_width"] <= width) == bool(expect)
        assert f"({m['cost_rounds']} rounds, {'width' if expect else 'cap'} reached)" in trial_block(trial_spec(trial_cfg), r)
    m = run_trial(trial_spec(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=bigram", "k=2")), progress=False,
                  loaded=(corpus, target)).metrics
    assert m["cost_rounds"] == 7 and "cost_width_reached" not in m
