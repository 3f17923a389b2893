"""hydra-ray-launcher's launcher, with one change: a job whose Ray worker died does not end
the sweep. The plugin gathers results with `ray.get` job after job, so the first lost worker
raised in the driver and Ray then cancelled every other job of the sweep. Here each job's
outcome is gathered on its own; a lost one is logged and handed to Hydra as a job that
returned nothing (as a job whose trial failed does: Hydra's sweeper would otherwise re-raise
it and skip on_multirun_end). The sweep's counts and exit status come, as always, from the
runs on the tracking server, where the parent marks the lost job's run FAILED.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra_plugins.hydra_ray_launcher import ray_launcher
from omegaconf import open_dict

log = logging.getLogger(__name__)


class RayLauncher(ray_launcher.RayLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import ray
        from hydra_plugins.hydra_ray_launcher._launcher_util import launch_job_on_ray, start_ray
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        log.info("Ray launcher: %d jobs on the cluster at %s", len(job_overrides), self.ray_cfg.init.get("address"))
        start_ray(self.ray_cfg.init)
        runs = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = f"job_id_for_{idx}"
                sweep_config.hydra.job.num = idx
            runs.append((idx, launch_job_on_ray(self.hydra_context, self.ray_cfg.remote, sweep_config,
                                                self.task_function, Singleton.get_state())))
        results = []
        for idx, ref in runs:
            try:
                results.append(ray.get(ref))
            except Exception as e:  # the worker died (or Ray lost the task): this job alone failed
                log.error("job #%d was lost on the cluster: %s", idx, str(e).splitlines()[0][:300])
                results.append(JobReturn(status=JobStatus.COMPLETED, _return_value=None))
        return results
