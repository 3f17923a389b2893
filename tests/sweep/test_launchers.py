"""The worker count a sweep reports is the one joblib runs: n_jobs=-2 on a 2-core machine is one
worker, not two (joblib's rule: cores + 1 + n_jobs for a negative n_jobs)."""
from __future__ import annotations

import joblib
import pytest
from omegaconf import OmegaConf

from src.engine.errors import SpecsweepError
from src.sweep.launchers import check_settings, n_workers

JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"


def config(n_jobs):
    return OmegaConf.create({"hydra": {"launcher": {"_target_": JOBLIB, "n_jobs": n_jobs}}})


def test_negative_n_jobs_counts_the_workers_joblib_runs():
    cores = joblib.cpu_count()
    assert n_workers(config(-1)) == cores
    assert n_workers(config(3)) == 3
    for n in range(-2, -cores - 1, -1):   # -2 (all but one core) down to -cores (one worker)
        check_settings(config(n))
        assert n_workers(config(n)) == cores + 1 + n == joblib.effective_n_jobs(n)
    with pytest.raises(SpecsweepError, match=f"down to -{cores}"):
        check_settings(config(-cores - 1))


def test_a_jobs_params_never_resolve_hydras_own_node():
    """A Ray driver records a job lost on the cluster from the job's config, outside any Hydra job:
    Hydra's node then cannot resolve (it interpolates the HydraConfig), and must not be resolved."""
    from src.sweep.tracking import trial_config
    plain = OmegaConf.create({"k": 4, "draft": {"name": "bigram"}, "tracking": {"uri": "x"}})
    with_hydra = OmegaConf.create({**OmegaConf.to_container(plain),
                                   "hydra": {"job": {"num": "${oc.env:SPECSWEEP_TEST_UNSET_VARIABLE}"}}})
    assert trial_config(with_hydra) == {"k": 4, "draft": {"name": "bigram"}}
