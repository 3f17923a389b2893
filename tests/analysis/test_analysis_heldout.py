"""The extended model fitted on the seed's drafts alone predicts other drafts' cells, chains and
trees (a tree's verify pass priced by its node count), from their own counters and component times.

Planted (analysis_fixtures.py), no noise: the paper drafts' trials follow the time model exactly,
so their fit recovers the planted parameters to rounding and its predictions of a new draft's
trials, planted with the same model, equal their measured base/speculative time ratio to 1e-6.
The negative control: priced by k instead of its node count, the tree's prediction is off.
"""
from __future__ import annotations

import pandas as pd
import pytest

from tests.analysis import fixtures as fx
from analysis.cost_models import PAPER_DRAFTS, PARAMS, model_errors, predict_trials

TRUTH = fx.Truth()
NEW = {"ngram": 1, "distilled+tree": 3}  # new draft -> verify nodes per drafted depth (1: a chain)


def new_draft_trials(name: str, nodes_per_depth: int, a: float = 0.8, t_draft: float = 3.0) -> list[dict]:
    """Trials of a draft the paper fit never sees: passes, drafted nodes and times by the planted model."""
    rows = []
    for k in fx.K:
        for seed in fx.SEEDS:
            t1 = fx.T1 * (1 + 0.01 * (seed - 1))
            passes = round(fx.N_CHARS / fx.expected_chars_per_pass(a, k))
            nodes = nodes_per_depth * k
            verify = t1 * (1 + TRUTH.b * nodes)
            base_s = fx.N_CHARS * (t1 + TRUTH.o_base) * 1e-6
            spec_s = (passes * (verify + TRUTH.o_pass) + passes * nodes * t_draft * (1 + TRUTH.gamma)) * 1e-6
            rows.append({"run_id": f"{name}-{k}-{seed}", "status": "FINISHED", "start_time": fx.START,
                         "draft": name, "k": k, "seed": seed, "target_passes": passes, "proposed": passes * nodes,
                         "baseline_passes": fx.N_CHARS, "target_pass_us": t1, "verify_pass_us": verify,
                         "draft_char_us": t_draft, "c": t_draft / t1, "chars_per_pass": fx.N_CHARS / passes,
                         "position_acceptance": a, "baseline_s_median": base_s, "speculative_s_median": spec_s,
                         "tree_nodes": nodes,
                         "overhead_us_per_pass": (spec_s * 1e6 - passes * verify - passes * nodes * t_draft) / passes})
    return rows


@pytest.fixture(scope="module")
def trials() -> pd.DataFrame:
    paper, _ = fx.noisy_frames(TRUTH, None)
    assert set(paper["draft"]) == set(PAPER_DRAFTS)
    new = [r for name, per in NEW.items() for r in new_draft_trials(name, per)]
    return pd.concat([paper, pd.DataFrame(new)], ignore_index=True)


def test_the_paper_fit_sees_only_the_paper_drafts_and_recovers_the_planted_parameters(trials):
    results = predict_trials(trials)
    assert results.paper is not None
    assert results.paper.trials == (trials["draft"].isin(PAPER_DRAFTS)).sum()
    for p in PARAMS:
        assert getattr(results.paper, p) == pytest.approx(getattr(TRUTH, p), rel=1e-6)


def test_the_paper_fit_predicts_new_chain_and_tree_drafts_exactly(trials):
    results = predict_trials(trials)
    new = ~trials["draft"].isin(PAPER_DRAFTS)
    measured = trials["baseline_s_median"] / trials["speculative_s_median"]
    predicted = results.trials["pred_paper"]
    pd.testing.assert_series_equal(predicted[new], measured[new], rtol=1e-6, check_names=False)


@pytest.mark.slow
def test_a_tree_priced_by_k_instead_of_its_node_count_is_mispredicted(trials):
    """Negative control: without `tree_nodes` the tree's verify passes look k wide, not 3k."""
    results = predict_trials(trials.drop(columns=["tree_nodes"]))
    tree = trials["draft"] == "distilled+tree"
    measured = trials["baseline_s_median"] / trials["speculative_s_median"]
    error = (results.trials["pred_paper"][tree] / measured[tree] - 1).abs()
    assert error.max() > 0.05


def test_the_paper_fit_is_judged_on_the_new_drafts_only():
    cells = pd.DataFrame({"draft": ["bigram", "ngram"], "k": [1, 1], "measured": [1.0, 1.0],
                          **{f"ape_{m}": [50.0, 2.0] for m in ("seed", "closed", "extended", "held_out", "paper")}})
    errors = model_errors(cells).set_index("model")
    paper = errors.loc[[m for m in errors.index if m.startswith("extended (paper")][0]]
    assert paper["cells"] == 1 and paper["max APE %"] == 2.0
    assert errors.loc["seed formula", "cells"] == 2
