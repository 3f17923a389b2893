"""The answer per workload and category (analysis/workloads.py) on planted prompt tables: the
field's total-time speedup, intervals that hold the spread over prompts and seeds, Spec-Bench's
table shape, the best k per category; and the prompts.csv artifacts read back from a store."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from analysis.sweep_data import prompt_rows
from analysis.workloads import OVERALL, category_frame, estimates, workload_tables


def planted(rng, seeds, prompts_per, categories=("a", "b"), speed=(2.0, 1.2), prompt_sd=0.25, seed_sd=0.05,
            rounds=5, noise=0.02, k=2, cell="ngram", workload="file") -> pd.DataFrame:
    """A prompts frame: per seed and prompt, baseline rounds around 1 s x its own size, speculative
    rounds at the prompt's own speedup: the category's, times a prompt effect, times a seed effect."""
    rows, idx = [], 0
    effects = {}
    for c, mu in zip(categories, speed):
        for _ in range(prompts_per):
            effects[idx] = (c, mu * np.exp(rng.normal(0, prompt_sd)), np.exp(rng.normal(0, 0.3)))
            idx += 1
    for s in seeds:
        for i, (c, sp, size) in effects.items():
            sp_s = sp * np.exp(rng.normal(0, seed_sd))
            b = size * np.exp(rng.normal(0, noise, rounds))
            sv = size / sp_s * np.exp(rng.normal(0, noise, rounds))
            rows.append({"run_id": f"r{s}", "prompt": i, "category": c, "seed": s, "k": k, "draft_name": cell,
                         "draft": cell, "workload": workload, "chars": 100, "target_passes": 100 / (1 + sp_s),
                         "baseline_rounds": " ".join(map(str, b)), "speculative_rounds": " ".join(map(str, sv))})
    return pd.DataFrame(rows)


def test_the_speedup_is_total_time_over_seeds_and_prompts():
    g = planted(np.random.default_rng(0), [0, 1], 3)
    e = estimates(g, 0.95, reps=200)
    med = lambda col: g[col].map(lambda t: np.median([float(x) for x in t.split()]))   # noqa: E731
    assert e["speedup"] == pytest.approx(med("baseline_rounds").sum() / med("speculative_rounds").sum())
    assert e["chars per pass"] == pytest.approx(g["chars"].sum() / g["target_passes"].sum())
    assert (e["seeds"], e["prompts"]) == (2, 6) and e["lo"] <= e["speedup"] <= e["hi"]


def population_truth(rng) -> float:
    big = planted(rng, range(40), 1500, categories=("a",), speed=(1.6,))
    b = big["baseline_rounds"].map(lambda t: np.median([float(x) for x in t.split()]))
    s = big["speculative_rounds"].map(lambda t: np.median([float(x) for x in t.split()]))
    return b.sum() / s.sum()


def test_the_interval_holds_the_spread_over_prompts_and_seeds():
    """120 planted sweeps of 3 seeds x 10 prompts of one category against the population's total-time
    speedup (60,000 prompt-seeds): the 95% interval covers it in 112 of them here (93%); the test asks
    105 (87.5%: 2.6 sigma below 93% for 120 sweeps); unwidened for the few seeds and prompts it covered
    102, which the test catches. Its width follows the prompts' spread: with none planted it is half as
    wide (what is left: the seeds' spread, widened for 3 seeds)."""
    rng = np.random.default_rng(3)
    truth = population_truth(rng)
    covered = 0
    for t in range(120):
        e = estimates(planted(rng, [0, 1, 2], 10, categories=("a",), speed=(1.6,)), 0.95, reps=300, seed=t)
        covered += e["lo"] <= truth <= e["hi"]
    assert covered >= 105, covered
    wide = estimates(planted(np.random.default_rng(5), [0, 1, 2], 10, categories=("a",), speed=(1.6,)), 0.95)
    narrow = estimates(planted(np.random.default_rng(5), [0, 1, 2], 10, categories=("a",), speed=(1.6,),
                               prompt_sd=0.0), 0.95)
    assert (wide["hi"] - wide["lo"]) > 1.5 * (narrow["hi"] - narrow["lo"])   # 0.43 against 0.22 here


def test_spec_bench_shaped_tables_and_the_best_k_per_category():
    rng = np.random.default_rng(1)
    frames = [planted(rng, [0, 1], 4, speed=sp, k=k) for k, sp in ((1, (1.5, 1.3)), (2, (2.2, 1.1)), (4, (1.9, 0.8)))]
    frame = category_frame(pd.concat(frames, ignore_index=True), 0.95, reps=300)
    assert sorted(frame["category"].unique()) == ["a", "b", OVERALL] and len(frame) == 9
    table, best = workload_tables(frame)
    assert table.name == "workload_file" and list(table.df.columns) == [
        "draft", "k", "a", "a cpp", "b", "b cpp", OVERALL, f"{OVERALL} cpp", "seeds"]
    assert table.df["k"].tolist() == [1, 2, 4] and table.df["a"].str.match(r"^\d\.\d\d \[\d\.\d\d-\d\.\d\d\]$").all()
    picks = best.df.set_index("category")
    assert picks.loc["a", "best k"] == 2 and picks.loc["b", "best k"] == 1           # the planted best per category
    assert picks.loc["a", "verdict"] == "pays"


def test_the_prompt_tables_are_read_back_from_the_store(tmp_path):
    """prompts.csv of each finished trial, with the trial's cell columns; a trial without one (run
    before workloads) is left out, not a crash."""
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.create_experiment("e", artifact_location=str(tmp_path / "artifacts"))
    runs = [client.create_run(exp).info.run_id for _ in range(2)]
    (tmp_path / "prompts.csv").write_text("prompt,category,n_chars,text,target_passes,chars,baseline_rounds,"
                                          "speculative_rounds\n0,a,8,\"x, y\",4,9,0.1 0.2,0.05 0.1\n1,b,8,z,5,8,,\n")
    client.log_artifact(runs[0], str(tmp_path / "prompts.csv"))
    finished = pd.DataFrame({"run_id": runs, "draft": ["ngram", "ngram"], "k": [2, 2], "seed": [0, 1],
                             "draft_name": ["ngram"] * 2, "workload": ["file"] * 2})
    rows = prompt_rows(client, finished)
    assert rows["run_id"].unique().tolist() == [runs[0]] and rows["category"].tolist() == ["a", "b"]
    assert rows["text"].tolist() == ["x, y", "z"] and rows["speculative_rounds"].tolist() == ["0.05 0.1", ""]


def test_the_pays_map_places_each_category():
    """A chain cell of a workload of two categories gives one point per category, at that category's
    median per-position acceptance and the cell's median c; a cell of one category none."""
    from analysis.pays import category_points
    chain = pd.DataFrame({"draft": ["ngram#validation"] * 2 + ["bigram"], "k": [2, 2, 2], "c": [0.01, 0.03, 0.2],
                          "position_acceptance.verse": [0.7, 0.8, np.nan],
                          "position_acceptance.prose": [0.5, 0.6, np.nan],
                          "position_acceptance.single": [np.nan, np.nan, 0.4]})
    pts = category_points(chain)
    assert pts.to_dict("records") == [
        {"draft": "ngram#validation", "k": 2, "category": "verse", "a": pytest.approx(0.75), "c": pytest.approx(0.02)},
        {"draft": "ngram#validation", "k": 2, "category": "prose", "a": pytest.approx(0.55), "c": pytest.approx(0.02)}]
