"""Configs compose; a real multirun of `smoke` lands in a fresh store, counters equal across n_jobs."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tests.conftest import runs_of, smoke_cmd, trial_counters

from src.paths import REPO  # noqa: E402
from tests.commands import run_command

pytestmark = pytest.mark.slow  # real sweeps and servers: minutes (make test-fast skips them)
CONF, SWEEPS = REPO / "conf", REPO / "sweeps"
GROUP_OPTIONS = [(g.name, p.stem) for g in sorted(CONF.iterdir()) if g.is_dir() for p in sorted(g.glob("*.yaml"))]
SWEEP_FILES = sorted(p.stem for p in SWEEPS.glob("*.yaml"))
REQUIRED_PARAMS = ["draft", "k", "seed", "n_chars", "pairs_min", "temperature", "target_key"]
REQUIRED_METRICS = ["acceptance", "chars_per_pass", "target_passes", "c", "target_pass_us", "draft_char_us",
                    "verify_pass_us", "speedup_median", "speedup_min", "speedup_max", "predicted_speedup",
                    "acceptance_pos_1", "analytic_acceptance", "position_acceptance", "pairs_used",
                    "width_reached", "speedup_lo", "speedup_hi", "speedup_interval_confidence",
                    "interval_rel_width"]


@pytest.mark.parametrize("group,option", GROUP_OPTIONS)
def test_every_config_group_option_composes(group, option):
    """Choosing an option puts that file's own values into its group (a default of another file, or a
    misnamed key, would show), and the composed config becomes a trial spec or is refused in one
    sentence (never another error)."""
    from omegaconf import OmegaConf

    from src.engine.errors import SpecsweepError
    from src.trial.spec import trial_spec
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"{group}={option}"])
    own = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml"), resolve=False)
    own.pop("defaults", None)
    chosen = OmegaConf.to_container(cfg[group], resolve=False)
    assert own and {key: chosen.get(key, "<missing>") for key in own} == own
    try:
        trial_spec(cfg)
    except SpecsweepError:
        pass   # a valid option that needs another beside it (draft=prompt_lookup needs engine=transformers)


@pytest.mark.parametrize("name", SWEEP_FILES)
def test_every_sweep_file_composes(name):
    with initialize_config_dir(config_dir=str(SWEEPS), version_base="1.3"):
        cfg = compose(name, overrides=[f"hydra.searchpath=[file://{CONF}]"], return_hydra_config=True)
    assert cfg.sweep_name == name
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert cfg.hydra.sweeper.params and "draft" in cfg.hydra.sweeper.params
    assert "joblib" in cfg.hydra.launcher._target_


def test_sweep_files_cover_the_issue_grids():
    with initialize_config_dir(config_dir=str(SWEEPS), version_base="1.3"):
        paper = compose("paper", overrides=[f"hydra.searchpath=[file://{CONF}]"], return_hydra_config=True)
    assert dict(paper.hydra.sweeper.params) == {"draft": "bigram,int8,int4", "k": "1,2,4,8", "seed": "range(5)"}


@pytest.mark.parametrize("name,model,drafts", [
    ("scaling", "medium", {"bigram", "ngram", "distilled", "small_model", "int8"}),
    ("scaling_small", "small", {"bigram", "ngram", "distilled", "int8"}),
])
def test_scaling_sweeps_plan_every_cell(name, model, drafts):
    """Both halves of the scaling study compose and pass validation cell by cell (the medium target
    with the small-model draft; the default target without it, which would draft for itself)."""
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from src.sweep.plan import plan_jobs
    with initialize_config_dir(config_dir=str(SWEEPS), version_base="1.3"):
        master = compose(name, overrides=[f"hydra.searchpath=[file://{CONF}]"], return_hydra_config=True)
        assert master.hydra.runtime.choices.model == model
        jobs = plan_jobs(master)
        assert GlobalHydra.instance().is_initialized()
    want = OmegaConf.load(CONF / "model" / f"{model}.yaml")
    assert len(jobs) == len(drafts) * 4 * 5
    assert {j.cfg.draft.name for j in jobs} == drafts
    assert all(j.cfg.model == want for j in jobs)


def test_smoke_multirun_logs_one_parent_and_finished_children(smoke_stores):
    uri, output = smoke_stores[2]
    client, runs = runs_of(uri)
    parents = [r for r in runs if r.data.tags.get("specsweep.kind") == "sweep"]
    trials = [r for r in runs if r.data.tags.get("specsweep.kind") == "trial"]
    targets = [r for r in runs if r.data.tags.get("specsweep.kind") == "target"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.tags["n_jobs"] == "2" and parents[0].data.tags["trials_planned"] == "6"
    assert len(targets) == 1 and targets[0].info.status == "FINISHED"      # trained and logged once
    assert {a.path for a in client.list_artifacts(targets[0].info.run_id, "checkpoint")} >= {
        f"checkpoint/target-{targets[0].data.tags['target_key']}.pt"}
    assert len(trials) == 6 and all(r.info.status == "FINISHED" for r in trials)
    cells = {(r.data.params["draft"], int(r.data.params["k"])) for r in trials}
    assert cells == {(d, k) for d in ("bigram", "int8", "int4") for k in (1, 4)}
    for r in trials:
        assert r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert r.data.tags["target_run_id"] == targets[0].info.run_id
        for tag in ("git_commit", "git_dirty", "sweep_id", "config_hash", "host", "cpu_model", "torch_version",
                    "torch_threads", "n_jobs"):
            assert r.data.tags.get(tag), tag
        assert all(p in r.data.params for p in REQUIRED_PARAMS)
        assert all(m in r.data.metrics for m in REQUIRED_METRICS)
        assert {a.path for a in client.list_artifacts(r.info.run_id)} == {"pairs.csv", "config.yaml", "sample.txt",
                                                                         "prompts.csv"}
        history = client.get_metric_history(r.info.run_id, "speedup_pair")
        used = int(r.data.metrics["pairs_used"])  # adaptive: 4 pairs at least, 8 at most
        assert 4 <= used <= 8 and sorted(m.step for m in history) == list(range(used))
        if r.data.metrics["width_reached"]:  # checked after an even count, first reachable at 6 (96.9%)
            assert used in (6, 8) and r.data.metrics["interval_rel_width"] <= 0.10
        else:  # a cap: 8 pairs or 10 s of timed runs
            assert used == 8 or r.data.metrics["timed_s"] >= 10
        pairs_csv = Path(client.download_artifacts(r.info.run_id, "pairs.csv")).read_text().splitlines()
        assert len(pairs_csv) == 1 + used
        assert min(m.value for m in history) == pytest.approx(r.data.metrics["speedup_min"])
    assert "progress: 6/6 trials done (0 failed)" in output
    assert output.count("training target") >= 1


def test_counters_identical_across_n_jobs(smoke_stores):
    assert trial_counters(smoke_stores[1][0]) == trial_counters(smoke_stores[2][0])


def test_a_sweep_over_cells_another_sweep_finished_names_their_runs_and_its_analysis_has_every_cell(
        smoke_stores, tmp_path):
    """A second sweep, under another name, whose cells a first sweep finished runs none of them
    (resume: a cell is the same cell whatever sweep names it), records the runs it stands on
    (`reused.<cell key>` on its parent), and its analysis has every cell it planned: without the
    record it had none (the runs are tagged with the first sweep's id)."""
    first = Path(smoke_stores[1][0].removeprefix("sqlite:///")).parent            # the first sweep's store
    store = tmp_path / "store"
    shutil.copytree(first, store)                                                 # a copy: the fixture stays as it is
    cache = f"data.cache_dir={first.parent}/cache"    # the first sweep's own: the same configs, the same cells
    cmd = [cache if a.startswith("data.cache_dir=") else a for a in smoke_cmd(store, 1, "draft=bigram,int8", "k=4",
                                                                                        "sweep_name=another")]
    proc = run_command(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 cells: 2 done, 0 to run" in proc.stdout + proc.stderr
    uri = f"sqlite:///{store}/mlflow.db"
    _, runs = runs_of(uri)
    trials = [r for r in runs if r.data.tags.get("specsweep.kind") == "trial"]
    assert len(trials) == 6                                       # nothing ran again
    second = [r for r in runs if r.data.tags.get("specsweep.kind") == "sweep" and r.data.tags["trials_planned"] == "2"]
    assert len(second) == 1 and second[0].info.status == "FINISHED" and second[0].data.tags["sweep_name"] == "another"
    reused = {key.removeprefix("reused."): v for key, v in second[0].data.params.items() if key.startswith("reused.")}
    assert reused == {r.data.tags["config_hash"]: r.info.run_id for r in trials
                      if (r.data.params["draft"], r.data.params["k"]) in {("bigram", "4"), ("int8", "4")}}
    from analysis.sweep_data import connect, load_sweep
    data = load_sweep(connect(uri), "specsweep", second[0].data.tags["sweep_id"])
    assert sorted(zip(data.trials["draft"], data.trials["k"])) == [("bigram", 4), ("int8", 4)]
    assert set(data.pairs["run_id"]) == set(reused.values())     # their pair timings come along
    whole = load_sweep(connect(uri), "specsweep", trials[0].data.tags["sweep_id"])
    assert len(whole.trials) == 6                                 # the first sweep's analysis: its own six
