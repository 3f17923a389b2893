"""The launchers a sweep runs on (conf/hydra/launcher/): what each needs, checked before any
write, and two adjustments to hydra-ray-launcher 1.2.2, made in the sweep's parent when it
uses Ray.

1. A job whose Ray worker died (or could not import the project) must not end the sweep. The
   plugin gathers results with `ray.get` job after job, so the first lost worker raised in the
   driver, Hydra skipped the rest of the sweep and Ray cancelled every other job. Hydra accepts
   launchers only from the `hydra_plugins` package, so instead of a launcher of our own the
   plugin's module gets a `ray` whose `get` hands a lost job to Hydra as a job that returned
   nothing (as a job whose trial failed does), after recording a FAILED run with the reason
   (the plugin's `launch_job_on_ray` is wrapped to note each job's config). The sweep's counts
   and exit status come, as always, from the runs on the tracking server.
2. A driver connecting to a loopback cluster needs RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, or
   Ray swaps 127.0.0.1 for the host's routable address and retries forever
   (src/cluster/servers.py keeps its nodes on loopback the same way).
"""
from __future__ import annotations

import importlib
import ipaddress
import logging
import os

from omegaconf import DictConfig

from ..engine.errors import SpecsweepError
from .store import is_host_local

log = logging.getLogger(__name__)

# Launchers whose jobs all run on this host (a SQLite store works with them).
HOST_LOCAL_LAUNCHERS = {"BasicLauncher", "JoblibLauncher", "LocalLauncher"}


def launcher_name(config: DictConfig) -> str:
    return str(config.hydra.launcher.get("_target_", "BasicLauncher")).rsplit(".", 1)[-1]


def n_workers(config: DictConfig) -> int:
    """Parallel workers that run: joblib's own count for n_jobs (-1: one per core joblib sees,
    -2: all but one, ...); 0 where the launcher or the cluster decides (ray, submitit)."""
    n = config.hydra.launcher.get("n_jobs")
    if n is None:
        return 1 if launcher_name(config) == "BasicLauncher" else 0
    import joblib
    return joblib.effective_n_jobs(int(n))


def _whole(key: str, value, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise SpecsweepError(f"hydra.launcher.{key} must be an integer >= {lo}, got {value!r}")


def check_settings(config: DictConfig) -> None:
    """The launcher's own settings, each in range (one sentence if not)."""
    launcher = config.hydra.launcher
    n = launcher.get("n_jobs")
    if n is not None:
        import joblib
        cores = joblib.cpu_count()
        if isinstance(n, bool) or not isinstance(n, int) or n == 0 or (n < 0 and cores + 1 + n < 1):
            raise SpecsweepError(f"hydra.launcher.n_jobs must be an integer >= 1, or -1 for one per core "
                                 f"(-2: all but one, down to -{cores}), got {n!r}")
    for key in ("cpus_per_task", "timeout_min", "array_parallelism"):
        if launcher.get(key) is not None:
            _whole(key, launcher.get(key), 1)
    mem = launcher.get("mem_gb")
    if mem is not None and (isinstance(mem, bool) or not isinstance(mem, (int, float)) or mem <= 0):
        raise SpecsweepError(f"hydra.launcher.mem_gb must be a number > 0, got {mem!r}")
    remote = launcher.get("ray", {}).get("remote", {}) if launcher.get("ray") is not None else {}
    cpus = remote.get("num_cpus")
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or cpus <= 0):
        raise SpecsweepError(f"hydra.launcher.ray.remote.num_cpus must be a number > 0, got {cpus!r}")
    if remote.get("max_retries") is not None:
        _whole("ray.remote.max_retries", remote.get("max_retries"), 0)


def check_launcher(config: DictConfig, uri: str) -> None:
    """One line, before anything is written, for a combination that cannot work."""
    check_settings(config)
    name = launcher_name(config)
    if name not in HOST_LOCAL_LAUNCHERS and is_host_local(uri):
        raise SpecsweepError(f"the {name} launcher runs trials on other hosts, which cannot reach the host-local "
                             f"store {uri}: use a tracking server (make tracking-server; "
                             "MLFLOW_TRACKING_URI=http://...)")
    if name == "RayLauncher":
        address = config.hydra.launcher.ray.init.get("address")
        if not address:
            raise SpecsweepError("hydra/launcher=ray connects to a running Ray cluster: set RAY_ADDRESS "
                                 "(make ray-up prints it)")
        keep_loopback(str(address))            # before Ray is imported: it reads the setting then
    module = str(config.hydra.launcher.get("_target_", "")).rsplit(".", 1)[0]
    if module:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise SpecsweepError(f"the {name} launcher needs the cluster extra ({e.name} is missing): "
                                 "make setup-cluster") from None
    if name == "RayLauncher":
        tolerate_lost_workers()


class _TolerantRay:
    """The `ray` module, but `get` of one job's result never raises: a lost job (its worker died,
    or could not import the project) is recorded FAILED on the server with its one-line reason
    (src/sweep/job.py: record_early_failure), and handed to Hydra as a job that returned nothing."""

    def __init__(self, ray) -> None:
        self._ray = ray
        self.configs: dict = {}   # object ref -> the job's config (launch_job_on_ray, below)

    def __getattr__(self, name):
        return getattr(self._ray, name)

    def get(self, ref, *args, **kwargs):
        from hydra.core.utils import JobReturn, JobStatus
        try:
            return self._ray.get(ref, *args, **kwargs)
        except self._ray.exceptions.RayError as e:  # its worker died, or Ray lost the task
            reason = ray_reason(e)
            cfg = self.configs.get(ref)
            num = cfg.hydra.job.num if cfg is not None else "?"
            log.error("trial #%s was lost on the cluster: %s", num, reason)
            if cfg is not None:
                from .context import SweepContext
                from .job import record_early_failure
                ctx = SweepContext.from_cfg(cfg)
                if ctx is not None and not job_has_run(ctx, num):  # a trial that started has its own run:
                    record_early_failure(cfg, ctx, num, f"lost on the cluster: {reason}")  # marked lost at the end
            return JobReturn(status=JobStatus.COMPLETED, _return_value=None)


def job_has_run(ctx, num) -> bool:
    from .ledger import invocation_runs
    from .tracking import client_for
    try:
        runs = invocation_runs(client_for(ctx.tracking_uri), ctx.experiment_id, ctx.invocation)
    except Exception:
        return False
    return any(r.data.tags.get("job_num") == str(num) for r in runs)


def ray_reason(e: Exception) -> str:
    """The one line that says why a Ray task failed: its exception's own line when the traceback
    holds one (e.g. "ModuleNotFoundError: No module named 'src'"), else the error's first line."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head:
            return line
    return lines[0] if lines else type(e).__name__


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def keep_loopback(address: str) -> None:
    """Call before Ray is imported (it reads the setting at import)."""
    if _is_loopback(address):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def tolerate_lost_workers() -> None:
    from hydra_plugins.hydra_ray_launcher import _core
    if isinstance(_core.ray, _TolerantRay):
        return
    tolerant = _core.ray = _TolerantRay(_core.ray)
    launch = _core.launch_job_on_ray

    def launch_and_note(hydra_context, ray_remote, sweep_config, task_function, singleton_state):
        ref = launch(hydra_context, ray_remote, sweep_config, task_function, singleton_state)
        tolerant.configs[ref] = sweep_config   # so that a lost job's run can name its cell
        return ref
    _core.launch_job_on_ray = launch_and_note
