"""A tree trial (verify=tree) on the tiny model: its config checked when the spec is built, its
shape logged and used, and the analysis keeping trees apart from the chain."""
from __future__ import annotations

import re

import pytest

from src.engine.errors import SpecsweepError
from src.trial.spec import trial_spec
from src.trial.trial import run_trial
from tests.conftest import compose_cfg


@pytest.mark.parametrize("overrides,message", [
    (["verify=tree", "k=3"], "k (3) must equal the tree's depth"),
    (["verify=tree", "verify.widths=[2,0]", "k=2"], "verify.widths must be a non-empty list of integers >= 1"),
    (["verify=tree", "verify.widths=[]"], "verify.widths must be a non-empty list"),
    (["verify.name=graph"], "unknown verify 'graph'"),
])
def test_bad_tree_config_is_refused_in_one_line(tiny, overrides, message):
    cfg, _, _ = tiny
    with pytest.raises(SpecsweepError, match=re.escape(message)) as e:
        trial_spec(compose_cfg(cfg.data.path, cfg.data.cache_dir, *overrides))
    assert "\n" not in str(e.value)


def test_tree_trial_logs_its_shape_and_uses_the_tree(tiny):
    from src.sweep.tracking import trial_params
    cfg, _, _ = tiny
    tcfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=bigram", "verify=tree", "verify.widths=[3,2]", "k=2",
                       "timing.target_width=null", "exactness.enabled=true", "exactness.samples=400")
    r = run_trial(trial_spec(tcfg), progress=False)
    m = r.metrics
    assert (m["tree_depth"], m["tree_nodes"], m["nodes_per_pass"], m["verify_nodes"]) == (2, 9, 9.0, 9)
    assert m["proposed"] == 9 * m["target_passes"] and "acceptance_pos_2" in m
    assert m["chars_per_pass"] == pytest.approx(1 + m["accepted"] / m["target_passes"])
    assert m["predicted_speedup"] == pytest.approx(m["chars_per_pass"] / (1 + 9 * m["c"]))
    assert 0 <= m["tvd_speculative"] < 0.2
    spec = trial_spec(tcfg)
    params = trial_params(tcfg, spec, "key")
    assert (params["verify"], params["tree_widths"], spec.label) == ("tree", "3-2", "bigram-tree3-2-s0")
    chain = compose_cfg(cfg.data.path, cfg.data.cache_dir)
    assert trial_params(chain, trial_spec(chain), "key")["verify"] == "chain"


def test_analysis_keeps_trees_apart_from_the_chain():
    """A tree trial and a chain trial of the same draft and k are different cells."""
    import pandas as pd
    from analysis.sweep_data import tidy_runs
    raw = pd.DataFrame({"run_id": ["a", "b", "c"], "status": ["FINISHED"] * 3,
                        "params.draft": ["bigram"] * 3, "params.k": ["4"] * 3, "params.seed": ["0"] * 3,
                        "params.verify": ["chain", "tree", None], "params.tree_widths": [None, "4-2-2-1", None]})
    assert tidy_runs(raw)["draft"].tolist() == ["bigram", "bigram+tree4-2-2-1", "bigram"]
