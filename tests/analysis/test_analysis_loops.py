"""The loops table (analysis/loops.py): the tool's loop against transformers' on planted trials whose
terms are known, so the account and the term that differs most are known exactly."""
from __future__ import annotations

import pandas as pd
import pytest

from analysis.loops import loops_table


def trial(engine: str, seed: int, base: float, verify: float, draft: float, overhead: float) -> dict:
    label = "int8" if engine == "eager" else f"int8@{engine}"
    return {"draft": label, "draft_name": "int8", "draft_options": "", "policy": "fixed", "tree": "",
            "engine": engine, "k": 4, "seed": seed, "batch": 1, "base_pass_us": base,
            "verify_pass_us": verify, "draft_char_us": draft, "overhead_us_per_pass": overhead,
            "chars_per_pass": 3.0, "proposed": 40, "target_passes": 10}     # 4 drafted chars per pass


def planted(library_draft: float) -> pd.DataFrame:
    rows = [trial("eager", s, base=1000, verify=1500, draft=100, overhead=100) for s in range(3)]
    rows += [trial("transformers", s, base=2000, verify=2000, draft=library_draft, overhead=1000) for s in range(3)]
    return pd.DataFrame(rows)


MEASURED = pd.DataFrame({"draft": ["int8", "int8@transformers"], "k": [4, 4], "measured": [1.5, 0.6],
                         "lo": [1.4, 0.5], "hi": [1.6, 0.7]})


def test_each_pass_is_accounted_in_the_loops_own_plain_steps():
    df = loops_table(planted(library_draft=2000), MEASURED).df.set_index("loop")
    tool, lib = df.loc["eager"], df.loc["transformers"]
    # eager: (1500 + 4 * 100 + 100) / 1000 = 2.0 plain steps a pass; transformers: (2000 + 8000 + 1000) / 2000 = 5.5
    assert (tool["verify"], tool["draft cost"], tool["overhead"], tool["pass"]) == pytest.approx((1.5, 0.4, 0.1, 2.0))
    assert (lib["verify"], lib["draft cost"], lib["overhead"], lib["pass"]) == pytest.approx((1.0, 4.0, 0.5, 5.5))
    assert tool["account"] == pytest.approx(1.5) and lib["account"] == pytest.approx(3 / 5.5)
    assert (tool["measured"], lib["measured"]) == (1.5, 0.6)
    assert tool["differs most"].startswith("draft +3.60")


def test_the_term_named_follows_the_data():
    """Negative control: a cheap assistant in the library moves the blame from drafting to the verify pass."""
    df = loops_table(planted(library_draft=10), MEASURED).df.set_index("loop")
    assert df.loc["eager", "differs most"].startswith("verify -0.50")


def test_no_library_trials_no_table():
    assert loops_table(planted(2000).query("engine == 'eager'"), MEASURED) is None
