"""A sweep's plan, made in the parent before any worker starts.

Every job's config is composed and validated first (bad input stops the sweep with one line
before anything is written to the store), each job's cell keyed on its resolved spec
(src/sweep/resume.py), and every distinct target is trained once here with all cores and
published to the tracking server (src/sweep/targets.py).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from ..engine.errors import SpecsweepError
from ..trial.load import load_target
from ..trial.spec import TargetSpec, TrialSpec, trial_spec
from .compose import Compositions, job_overrides
from .resume import cell_key

log = logging.getLogger(__name__)


@dataclass
class PlannedJob:
    num: int
    overrides: list[str]
    cfg: DictConfig
    spec: TrialSpec
    cell_key: str                  # the cell's identity (src/sweep/resume.py: cell_key)
    target_key: str = ""


def swept_keys(config: DictConfig) -> set[str]:
    """The keys given with a sweep of values (k=1,2; seed=range(5)) on the line or in the sweep file."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    parsed = OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task))
    return {o.key_or_group for o in parsed if o.is_sweep_override()}


def plan_jobs(config: DictConfig, compositions: Compositions | None = None) -> list[PlannedJob]:
    """Compose and validate every job's config; the first bad one raises SpecsweepError.
    `compositions` (src/sweep/compose.py) composes them, once per group choice."""
    if compositions is None:
        compositions = Compositions(GlobalHydra.instance().config_loader(), config)
    all_overrides = job_overrides(config)
    values: dict[str, set] = {}
    for overrides in all_overrides:
        for o in overrides:
            values.setdefault(o.split("=", 1)[0], set()).add(o)
    swept = {key for key, seen in values.items() if len(seen) > 1}
    listed = swept_keys(config)   # the keys the command sweeps over, even with one value repeated
    jobs = []
    for num, overrides in enumerate(all_overrides):
        label = " ".join(o for o in overrides if o.split("=", 1)[0] in swept)  # what tells this trial apart
        try:
            cfg = compositions.compose(list(overrides))
        except Exception as e:
            raise SpecsweepError(f"trial #{num} ({label}): {str(e).splitlines()[0]}") from None
        with_hydra = cfg
        cfg = OmegaConf.masked_copy(with_hydra, [k for k in with_hydra if k != "hydra"])
        try:
            spec = trial_spec(cfg)
        except SpecsweepError as e:
            raise SpecsweepError(f"trial #{num} ({label}): {e}") from None
        job = PlannedJob(num, list(overrides), cfg, spec, cell_key(spec))
        twin = next((j for j in jobs if j.cell_key == job.cell_key), None)
        if twin is not None:  # `k=1,1`: one cell twice would count as two
            raise SpecsweepError(f"trials #{twin.num} and #{num} are the same cell "
                                 f"({' '.join(o for o in overrides if o.split('=', 1)[0] in listed)}): "
                                 "a sweep lists each value once; remove the repeated value")
        jobs.append(job)
    return jobs


def prepare_targets(jobs: list[PlannedJob], publish) -> list:
    """Train (or load) each distinct target once, here, with all cores; publish it with
    `publish(target, target_spec)` (to the tracking server) and note its key on every job. A
    model draft's own trained model (`draft.model`) is a target too, trained and published the
    same way, so no worker ever trains one. Returns what `publish` returned, one per distinct
    target."""
    keys: dict[str, str] = {}
    published = []

    def prepare(spec: TargetSpec) -> str:
        ident = spec.identity()
        if ident not in keys:
            _, target = load_target(spec)
            published.append(publish(target, spec))
            keys[ident] = target.key
        return keys[ident]

    for job in jobs:
        job.target_key = prepare(job.spec.target)
        if job.spec.draft.model is not None:
            prepare(job.spec.draft.model)
    return published


