"""Synthetic sweeps with planted values, written into a throwaway MLflow SQLite store.

Every trial's counters and times come from a known time model (the extended cost model of
analysis/cost_models.py, written out again here independently):

    baseline    B = n * (t1 + O_BASE)
    speculative S = P * (t1 * (1 + B_SLOPE * k) + O_PASS) + D * t_draft * (1 + GAMMA)

with P target passes and D = k * P drafted chars. Pair timings scatter around B and S with
fixed relative offsets whose median is exactly 0, so each trial's medians are exactly B and S
and the fit can recover the planted parameters; the pair ratios themselves are not B / S, so
pooled statistics are tested against the planted ratios.

The grid is drafts x K x SEEDS with holes: one FAILED trial, a cell with no finished trial
(FAILED, RUNNING and never started), a FAILED run later redone, and a FAILED run without
params. Older sweeps in the same experiment check that "latest" picks the newest and that
a sweep with one trial, with no trial or with no finished trial is handled. Every trial
carries the `cpu_model` and `host` tags of one machine.

Noisy sweeps (`Noise`, `noisy_frames`, `plant_noisy_sweeps`) draw each pair's arm times with
heavy-tailed relative scatter (Student-t), the component times with a small normal scatter,
and can corrupt one trial's draft time (logged x factor, as a mis-measurement would be: the
speculative arm ran at the true speed); they may plant other parameters (`Truth`) and tag
trials with several CPU models.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

EXPERIMENT = "specsweep-test"
SWEEP_ID = "sweep-new"
OLD_SWEEP_ID = "sweep-old"
EMPTY_SWEEP_ID = "sweep-empty"   # a parent run without trials
DEAD_SWEEP_ID = "sweep-dead"     # only a FAILED trial
N_CHARS = 200
PAIRS = 5
K = (1, 2, 4, 8)
SEEDS = (0, 1, 2)

# planted time model, microseconds
T1 = 1000.0
B_SLOPE = 0.05
O_PASS = 150.0
GAMMA = 0.1      # in-loop excess of a drafted char, as a fraction of t_draft
O_BASE = 30.0
# draft -> (per-position acceptance, draft time per char in us); in the loop a drafted char costs
# t_draft * (1 + GAMMA): 26.4, 1210 and 165 us
DRAFTS = {"bigram": (0.40, 24.0), "int8": (0.90, 1100.0), "int4": (0.80, 150.0)}

# relative scatter of the pair timings; the median of each list is exactly 0
BASE_EPS = (0.0, 0.010, -0.005, 0.004, -0.008)
SPEC_EPS = (0.006, -0.004, 0.0, 0.009, -0.007)

CPU = ("Planted CPU A @ 2.0GHz", "host-a")  # (cpu_model, host) tags of every trial of plant_sweeps


@dataclass(frozen=True)
class Truth:
    """The planted time model's parameters (microseconds; b and gamma are fractions)."""
    b: float = B_SLOPE
    o_pass: float = O_PASS
    gamma: float = GAMMA
    o_base: float = O_BASE


@dataclass(frozen=True)
class Noise:
    """Seeded measurement noise of a planted sweep."""
    seed: int
    arm: float = 0.03           # scale of the Student-t relative scatter of each arm's time in each pair
    df: float = 2.0             # its degrees of freedom (2: infinite variance)
    component: float = 0.01     # sd of the normal relative scatter of t1, tv and td
    corrupt: tuple | None = ("int8", 8, 2)  # the trial whose draft time is logged x corrupt_factor
    corrupt_factor: float = 1.8


FAILED_KEYS = {("int8", 2, 1): "FAILED", ("int4", 8, 0): "FAILED", ("int4", 8, 1): "RUNNING"}
NEVER_RUN = {("int4", 8, 2)}
REDONE = ("bigram", 4, 1)  # a FAILED run, then a FINISHED one


@dataclass
class Planted:
    uri: str
    experiment_id: str
    parent_run_id: str
    old_parent_run_id: str
    trials: dict = field(default_factory=dict)   # (draft, k, seed) -> metrics dict
    ratios: dict = field(default_factory=dict)   # (draft, k, seed) -> list of pair ratios


def expected_chars_per_pass(a: float, k: int) -> float:
    """1 + a + ... + a^k, summed term by term: the tests' own oracle, not the formula under test."""
    return sum(a ** i for i in range(k + 1))


def trial_metrics(draft: str, k: int, seed: int, truth: Truth = Truth(),
                  noise: Noise | None = None) -> tuple[dict, list[float], list[float]]:
    """Metrics of one planted trial and its per-pair (baseline, speculative) seconds."""
    a0, t_draft = DRAFTS[draft]
    a = a0 + 0.01 * (seed - 1)
    t1 = T1 * (1 + 0.01 * (seed - 1))
    passes = round(N_CHARS / expected_chars_per_pass(a, k))
    proposed = k * passes
    accepted = N_CHARS - passes
    verify = t1 * (1 + truth.b * k)
    base_s = N_CHARS * (t1 + truth.o_base) * 1e-6
    spec_s = (passes * (verify + truth.o_pass) + proposed * t_draft * (1 + truth.gamma)) * 1e-6
    if noise is None:
        rot = (seed + k) % PAIRS  # a different pairing of offsets in every trial
        base = [base_s * (1 + BASE_EPS[(i + rot) % PAIRS]) for i in range(PAIRS)]
        spec = [spec_s * (1 + SPEC_EPS[(i + 2 * rot) % PAIRS]) for i in range(PAIRS)]
    else:  # heavy-tailed arm times; the trial's medians are those of its pairs, as the harness logs them
        rng = np.random.default_rng([noise.seed, list(DRAFTS).index(draft), k, seed])
        scatter = np.clip(noise.arm * rng.standard_t(noise.df, size=(2, PAIRS)), -0.5, None)  # no time <= 0
        base = list(base_s * (1 + scatter[0]))
        spec = list(spec_s * (1 + scatter[1]))
        base_s, spec_s = float(np.median(base)), float(np.median(spec))
        t1, verify, t_draft = (x * (1 + noise.component * rng.standard_normal()) for x in (t1, verify, t_draft))
        if (draft, k, seed) == noise.corrupt:
            t_draft *= noise.corrupt_factor
    ratios = sorted(b / s for b, s in zip(base, spec))
    c = t_draft / t1
    m = {
        "acceptance": accepted / proposed,
        "position_acceptance": a,
        "analytic_acceptance": a + 0.005,
        "chars_per_pass": N_CHARS / passes,
        "target_passes": passes,
        "baseline_passes": N_CHARS,
        "draft_calls": passes,
        "proposed": proposed,
        "accepted": accepted,
        "target_pass_us": t1,
        "verify_pass_us": verify,
        "draft_char_us": t_draft,
        "c": c,
        "speedup_median": ratios[PAIRS // 2],
        "speedup_min": ratios[0],
        "speedup_max": ratios[-1],
        "speedup_range_confidence": 1 - 2 * 0.5 ** PAIRS,
        "baseline_iqr_rel": 0.01,
        "speculative_iqr_rel": 0.30 if (draft, k, seed) == ("int8", 8, 0) else 0.01,
        "min_cpu_wall_ratio": 0.99,
        "baseline_s_median": base_s,
        "speculative_s_median": spec_s,
        "predicted_speedup": (N_CHARS / passes) / (1 + k * c),
        "overhead_us_per_pass": (spec_s * 1e6 - passes * verify - proposed * t_draft) / passes,
    }
    for i in range(1, k + 1):
        m[f"acceptance_pos_{i}"] = a ** i
    if k == 1:  # the exactness check ran only at k = 1
        m["tvd_speculative"] = 0.010 + 0.001 * list(DRAFTS).index(draft) + 0.0001 * seed
        m["tvd_direct"] = 0.012 + 0.0001 * seed
    return m, base, spec


def true_speedup(draft: str, k: int, seed: int = 1, truth: Truth = Truth()) -> float:
    m, _, _ = trial_metrics(draft, k, seed, truth)
    return m["baseline_s_median"] / m["speculative_s_median"]


def _params(draft, k, seed) -> list[Param]:
    values = {"draft": draft, "k": k, "seed": seed, "n_chars": N_CHARS, "pairs_min": PAIRS,
              "temperature": 1.0, "target_key": "tgt0", "model.n_layer": 2, "timing.confidence": 0.95}
    return [Param(name, str(v)) for name, v in values.items()]


class _Writer:
    def __init__(self, client: MlflowClient, experiment_id: str):
        self.client, self.experiment_id, self.clock = client, experiment_id, 1_700_000_000_000

    def tick(self) -> int:
        self.clock += 1000
        return self.clock

    def parent(self, sweep_id: str, name: str) -> str:
        run = self.client.create_run(self.experiment_id, start_time=self.tick(), tags={
            "specsweep.kind": "sweep", "sweep_id": sweep_id, "sweep_name": name})
        return run.info.run_id

    def trial(self, parent: str, sweep_id: str, key, status: str, metrics=None, pairs=None,
              with_params: bool = True, cpu: tuple[str, str] | None = CPU) -> str:
        where = {"cpu_model": cpu[0], "host": cpu[1]} if cpu else {}
        run = self.client.create_run(self.experiment_id, start_time=self.tick(), tags={
            "mlflow.parentRunId": parent, "specsweep.kind": "trial", "sweep_id": sweep_id,
            "config_hash": "-".join(map(str, key)), "target_key": "tgt0", **where})
        run_id = run.info.run_id
        ts = self.clock
        batch = [Metric(name, float(v), ts, 0) for name, v in (metrics or {}).items()]
        for name, values in (pairs or {}).items():
            batch += [Metric(name, float(v), ts, step) for step, v in enumerate(values)]
        self.client.log_batch(run_id, metrics=batch, params=_params(*key) if with_params else [])
        if status != "RUNNING":
            self.client.set_terminated(run_id, status, end_time=self.tick())
        return run_id


def plant_sweeps(tmp_dir) -> Planted:
    uri = f"sqlite:///{tmp_dir}/mlflow.db"
    client = MlflowClient(uri)
    # an explicit artifact location: the default would be ./mlruns under the working directory
    exp_id = client.create_experiment(EXPERIMENT, artifact_location=(tmp_dir / "artifacts").as_uri())
    w = _Writer(client, exp_id)

    old = w.parent(OLD_SWEEP_ID, "old")
    m, base, spec = trial_metrics("bigram", 1, 0)
    w.trial(old, OLD_SWEEP_ID, ("bigram", 1, 0), "FINISHED", m,
            {"speedup_pair": [b / s for b, s in zip(base, spec)], "baseline_s": base, "speculative_s": spec})

    w.parent(EMPTY_SWEEP_ID, "empty")
    dead = w.parent(DEAD_SWEEP_ID, "dead")
    w.trial(dead, DEAD_SWEEP_ID, ("int8", 4, 0), "FAILED")

    parent = w.parent(SWEEP_ID, "paper")
    planted = Planted(uri, exp_id, parent, old)
    for draft in DRAFTS:
        for k in K:
            for seed in SEEDS:
                key = (draft, k, seed)
                if key in NEVER_RUN:
                    continue
                if key in FAILED_KEYS:
                    w.trial(parent, SWEEP_ID, key, FAILED_KEYS[key])
                    continue
                if key == REDONE:
                    w.trial(parent, SWEEP_ID, key, "FAILED")
                m, base, spec = trial_metrics(*key)
                ratios = [b / s for b, s in zip(base, spec)]
                w.trial(parent, SWEEP_ID, key, "FINISHED", m,
                        {"speedup_pair": ratios, "baseline_s": base, "speculative_s": spec})
                planted.trials[key] = m
                planted.ratios[key] = ratios
    w.trial(parent, SWEEP_ID, ("?", 0, 0), "FAILED", with_params=False)  # died before logging params
    client.set_terminated(parent, "FINISHED")
    return planted


def closed_form(a: float, k: int, c: float) -> float:
    """The closed form from the term-by-term sum (the tests' own oracle)."""
    return expected_chars_per_pass(a, k) / (1 + k * c)


# --- noisy sweeps --------------------------------------------------------------------------------

def noisy_trials(truth: Truth, noise: Noise | None, drafts=tuple(DRAFTS), ks=K, seeds=SEEDS) -> dict:
    """(draft, k, seed) -> (metrics, pair ratios) of every trial of a full grid (noise None: exact medians)."""
    out = {}
    for key in ((d, k, s) for d in drafts for k in ks for s in seeds):
        m, base, spec = trial_metrics(*key, truth=truth, noise=noise)
        out[key] = (m, [b / s for b, s in zip(base, spec)])
    return out


START = pd.Timestamp(1_700_000_000, unit="s", tz="UTC")  # start time of the frames' runs


def noisy_frames(truth: Truth, noise: Noise | None, **grid) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(finished trials, pairs) frames in analysis.sweep_data's shapes, without a store: for fits on many seeds."""
    trials, pairs = [], []
    for (d, k, s), (m, ratios) in noisy_trials(truth, noise, **grid).items():
        run_id = f"{d}-{k}-{s}"
        trials.append({"run_id": run_id, "status": "FINISHED", "start_time": START, "draft": d, "k": k, "seed": s,
                       "draft_name": d, "draft_options": "", "policy": "fixed", "tree": "", "engine": "eager",
                       "batch": 1, "cpu_model": CPU[0], "host": CPU[1], **m})
        pairs += [(d, k, s, run_id, i, r) for i, r in enumerate(ratios)]
    return pd.DataFrame(trials), pd.DataFrame(pairs, columns=["draft", "k", "seed", "run_id", "pair", "ratio"])


@dataclass
class PlantedNoisy:
    uri: str
    experiment: str
    sweep_ids: list
    trials: dict = field(default_factory=dict)   # sweep_id -> {(draft, k, seed): (metrics, ratios)}


def plant_noisy_sweeps(tmp_dir, sweeps: dict, experiment: str = "specsweep-noisy") -> PlantedNoisy:
    """Write noisy sweeps into a fresh store: sweep_id -> dict(truth=, noise=, cpus=, grid...).

    `cpus` maps (draft, k, seed) -> (cpu_model, host) for trials that ran elsewhere than CPU."""
    uri = f"sqlite:///{tmp_dir}/mlflow.db"
    client = MlflowClient(uri)
    exp_id = client.create_experiment(experiment, artifact_location=(tmp_dir / "artifacts").as_uri())
    w = _Writer(client, exp_id)
    out = PlantedNoisy(uri, experiment, list(sweeps))
    for sweep_id, spec in sweeps.items():
        spec = dict(spec)
        truth, noise, cpus = spec.pop("truth", Truth()), spec.pop("noise"), spec.pop("cpus", {})
        parent = w.parent(sweep_id, sweep_id)
        out.trials[sweep_id] = noisy_trials(truth, noise, **spec)
        for key, (m, ratios) in out.trials[sweep_id].items():
            w.trial(parent, sweep_id, key, "FINISHED", m, {"speedup_pair": ratios}, cpu=cpus.get(key, CPU))
        client.set_terminated(parent, "FINISHED")
    return out
