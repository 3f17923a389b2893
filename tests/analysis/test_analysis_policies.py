"""Adaptive draft-length policies in the report: the comparison with the best fixed k, the drafted
lengths, and the cost models' use of a policy's mean drafted length. Planted cells and trials."""
from __future__ import annotations

import pandas as pd
import pytest

from analysis.cost_models import Extended, drafted_per_pass, seed_formula
from analysis.load import Label, parse_label
from analysis.policies import drafted_table, policies_table


def cells() -> pd.DataFrame:
    rows = [("ngram", 4, 2.0, 1.9, 2.1), ("ngram", 8, 2.2, 2.1, 2.3),            # best fixed: k = 8
            ("ngram~heuristic", 8, 2.3, 2.2, 2.4), ("ngram~heuristic", 16, 2.25, 2.1, 2.4),
            ("ngram~cost", 16, 2.6, 2.45, 2.7),                                    # clear of the fixed interval
            ("int8", 1, 0.8, 0.75, 0.85), ("int8~confidence", 4, 0.7, 0.65, 0.74)]
    return pd.DataFrame(rows, columns=["draft", "k", "measured", "lo", "hi"])


def test_labels_carry_the_policy():
    assert parse_label("ngram~cost@compiled") == Label("ngram", "", "compiled", 1, "cost")
    assert parse_label("ngram").policy == "fixed"


def test_each_policy_against_the_best_fixed_k():
    df = policies_table(cells()).df.set_index(["draft", "policy"])
    h = df.loc[("ngram", "heuristic")]
    assert (h["best cap"], h["best fixed k"]) == (8, 8)
    assert h["gain"] == pytest.approx(2.3 / 2.2 - 1) and h["told apart"] == "no (intervals overlap)"
    assert df.loc[("ngram", "cost"), "told apart"] == "better"            # 2.45 > 2.3
    assert df.loc[("int8", "confidence"), "told apart"] == "worse"        # 0.74 < 0.75
    assert policies_table(cells()[~cells()["draft"].str.contains("~")]) is None


def test_the_drafted_table_and_the_formulas_use_the_mean_drafted_length():
    t = pd.DataFrame({"draft": ["ngram~cost"] * 2 + ["ngram"], "k": [8, 8, 8], "drafted_mean": [3.0, 5.0, None],
                      "chars_per_pass": [3.0, 4.0, 4.5], "drafted_len_1": [0.5, 0.1, None],
                      "drafted_len_8": [0.5, 0.9, None], "acceptance_given_drafted_1": [0.9, 0.8, None],
                      "c": [0.1, 0.1, 0.1]})
    d = drafted_table(t).df
    assert list(d["draft"]) == ["ngram~cost"] and d["drafted mean"].iloc[0] == 4.0 and d["P(len 8)"].iloc[0] == 0.7
    assert drafted_per_pass(t).tolist() == [3.0, 5.0, 8.0]
    assert seed_formula(t).tolist() == pytest.approx([3.0 / 1.3, 4.0 / 1.5, 4.5 / 1.8])
    # the extended model's verify pass is linear in the drafted chars: the mean drafted length enters it
    m = Extended(b=0.1, o_pass=0.0, gamma=0.0, o_base=0.0, trials=3)
    times = t.assign(target_passes=10, proposed=[30, 50, 80], baseline_passes=40, target_pass_us=100.0,
                     draft_char_us=0.0)
    _, spec = m.times(times)
    assert spec.tolist() == pytest.approx([10 * 100 * 1.3, 10 * 100 * 1.5, 10 * 100 * 1.8])
