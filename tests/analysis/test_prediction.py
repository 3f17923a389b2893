"""analysis/prediction.py: the prediction's formulas on planted inputs, its APE summary and --validate's
timing line; the pays map's 1x contour (analysis/pays.py). No wall-clock time is asserted."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import figures
from analysis.pays import MAP_KS, PaysInputs, pays_grid
from analysis.prediction import ape_summary, prediction_table, probes_after
from src.engine.measuring.formula import Overheads, chars_per_pass, iid_chars_per_pass, speedup


# ---- the formulas -------------------------------------------------------------------------------
def test_planted_speedups_are_recovered_exactly():
    s = [0.5, 0.25, 0.125]                               # S_i = a^i with a = 0.5
    assert chars_per_pass(s, 2) == 1.75
    for k in (1, 2, 3):
        assert chars_per_pass(s, k) == pytest.approx(float(iid_chars_per_pass(0.5, k)), rel=1e-15)
    assert iid_chars_per_pass(1.0, 4) == 5.0             # k + 1 at a = 1
    # cpp t1 / (tv + n td): 1.75 * 100 / (150 + 2 * 10)
    assert speedup(1.75, 100.0, 150.0, 10.0, 2) == pytest.approx(175 / 170, rel=1e-15)
    # with overheads: cpp (t1 + o_base) / (tv + o_pass + n td (1 + gamma))
    o = Overheads(o_base=20.0, o_pass=30.0, gamma=0.5)
    assert speedup(1.75, 100.0, 150.0, 10.0, 2, o) == pytest.approx(1.75 * 120 / (150 + 30 + 2 * 10 * 1.5), rel=1e-15)
    # tv = t1 and no overheads: the seed formula cpp / (1 + k c)
    table = prediction_table(s, {k: {"k": k, "target_pass_us": 100.0, "verify_pass_us": 100.0, "draft_char_us": 5.0,
                                     "nodes": k} for k in (1, 2, 3)}, Overheads(), a=0.5)
    np.testing.assert_allclose(table["predicted"], table["seed formula"], rtol=1e-15)
    np.testing.assert_allclose(table["predicted"], [1.5 / 1.05, 1.75 / 1.1, 1.875 / 1.15], rtol=1e-15)
    np.testing.assert_allclose(table["cpp iid"], table["cpp"], rtol=1e-15)


@pytest.mark.parametrize("k", [1, 4, 16])
def test_a_draft_off_by_a_factor_moves_the_prediction_by_the_formulas_factor(k):
    s = 0.8 ** np.arange(1, k + 1)
    t1, tv, td = 800.0, 1000.0, 40.0
    base = speedup(chars_per_pass(s, k), t1, tv, td, k)
    # c doubled: only the 1 + k c term (here tv/t1 + k c) changes
    assert speedup(chars_per_pass(s, k), t1, tv, 2 * td, k) / base == pytest.approx(
        (tv / t1 + k * td / t1) / (tv / t1 + 2 * k * td / t1), rel=1e-12)
    # every position's acceptance halved: the chars per pass, and nothing else, change
    half = 1 + s.sum() / 2
    assert speedup(chars_per_pass(s / 2, k), t1, tv, td, k) / base == pytest.approx(half / (1 + s.sum()), rel=1e-12)
    # a verify pass twice as dear with a free draft: the prediction halves
    assert speedup(chars_per_pass(s, k), t1, 2 * tv, 0.0, k) / speedup(chars_per_pass(s, k), t1, tv, 0.0, k) == 0.5


def test_ape_summary_keeps_the_paper_drafts_apart():
    cells = pd.DataFrame({"draft_name": ["bigram", "int8", "bigram", "ngram", "ngram", "heads"],   # a cell's column
                          "draft": ["bigram", "int8", "bigram+tree2-1", "ngram", "ngram@compiled", "heads"],
                          "ape %": [1.0, 3.0, 8.0, 2.0, 10.0, np.nan]})
    out = ape_summary(cells, ("bigram", "int8", "int4")).set_index("cells")
    assert out.loc[3, ["median APE %", "max APE %"]].tolist() == [3.0, 8.0]     # bigram, int8, bigram's tree
    assert out.loc[2, ["median APE %", "max APE %"]].tolist() == [6.0, 10.0]    # ngram on two engines; heads: no error


# ---- the pays map -------------------------------------------------------------------------------
def test_pays_map_contour_at_one_lies_where_the_formula_says():
    """tv(k)/t1 = 1 + b k, no overheads: at k = 1 the speedup (1 + a) / (1 + b + c) is 1 on
    c = a - b, and every larger k gives (1 + a + ... + a^k) / (1 + k b + k (a - b)) <= 1 there
    (a^j <= a), so the best-k map's 1x contour is the line c = a - b."""
    b = 0.1
    a = np.linspace(b, 0.99, 50)
    s, k = pays_grid(a, a - b, MAP_KS, lambda k: 1 + b * k)
    np.testing.assert_allclose(s, 1.0, rtol=1e-12)
    assert (pays_grid(a, a - b + 0.01, MAP_KS, lambda k: 1 + b * k)[0] < 1).all()
    assert (pays_grid(a, a - b - 0.01, MAP_KS, lambda k: 1 + b * k)[0] > 1).all()
    # the drawn contour: its vertices lie on c = a - b within the grid's step
    inputs = PaysInputs("planted", b, 1000.0, Overheads(), pd.DataFrame(columns=["draft", "k", "a", "c", "measured"]))
    fig = figures.pays_map(inputs, MAP_KS, grid=121)
    cs = next(c for c in fig.axes[0].collections if hasattr(c, "levels") and 1.0 in list(c.levels))
    segs = np.concatenate(cs.allsegs[list(cs.levels).index(1.0)])          # (n, 2): (a, c) vertices
    step = max(0.999, 1.2) / 120
    assert len(segs) > 10 and np.abs(segs[:, 1] - (segs[:, 0] - b)).max() < step
    figures.plt.close(fig)


# ---- --validate's timing line ------------------------------------------------------------------
def test_validate_says_how_long_after_the_sweeps_last_trial_its_probes_ran():
    starts = pd.Series(pd.to_datetime(["2026-12-04 22:00", "2026-12-04 22:30", "2026-12-04 21:10"], utc=True))
    line = probes_after(starts, pd.Timestamp("2026-12-05 00:00", tz="UTC"))
    assert "from 2026-12-04 21:10 to 2026-12-04 22:30 UTC" in line and "began 1.5 h after its last" in line
