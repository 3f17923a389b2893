"""The launchers a sweep runs on (conf/hydra/launcher/): what each needs, checked before any
write, and two adjustments to hydra-ray-launcher 1.2.2, made in the sweep's parent when it
uses Ray.

1. A job whose Ray worker died must not end the sweep. The plugin gathers results with
   `ray.get` job after job, so the first lost worker raised in the driver, Hydra skipped the
   rest of the sweep and Ray cancelled every other job. Hydra accepts launchers only from the
   `hydra_plugins` package, so instead of a launcher of our own the plugin's module gets a
   `ray` whose `get` hands a lost job to Hydra as a job that returned nothing (as a job whose
   trial failed does). The sweep's counts and exit status come, as always, from the runs on
   the tracking server, where the parent marks the lost job's run FAILED.
2. A driver connecting to a loopback cluster needs RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, or
   Ray swaps 127.0.0.1 for the host's routable address and retries forever
   (src/sweep/servers.py keeps its nodes on loopback the same way).
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
    """Parallel workers as configured: joblib's n_jobs (-1: one per core); 0 where the
    launcher or the cluster decides (ray, submitit)."""
    n = config.hydra.launcher.get("n_jobs")
    if n is None:
        return 1 if launcher_name(config) == "BasicLauncher" else 0
    return os.cpu_count() if n < 0 else int(n)


def check_launcher(config: DictConfig, uri: str) -> None:
    """One line, before anything is written, for a combination that cannot work."""
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
    """The `ray` module, but `get` of one job's result never raises."""

    def __init__(self, ray) -> None:
        self._ray = ray

    def __getattr__(self, name):
        return getattr(self._ray, name)

    def get(self, ref, *args, **kwargs):
        from hydra.core.utils import JobReturn, JobStatus
        try:
            return self._ray.get(ref, *args, **kwargs)
        except self._ray.exceptions.RayError as e:  # its worker died, or Ray lost the task
            log.error("a job was lost on the cluster: %s", str(e).splitlines()[0][:300])
            return JobReturn(status=JobStatus.COMPLETED, _return_value=None)


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
    if not isinstance(_core.ray, _TolerantRay):
        _core.ray = _TolerantRay(_core.ray)
