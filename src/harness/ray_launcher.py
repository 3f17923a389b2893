"""Two adjustments to hydra-ray-launcher 1.2.2, made in the sweep's parent when it uses Ray.

1. A job whose Ray worker died must not end the sweep. The plugin gathers results with
   `ray.get` job after job, so the first lost worker raised in the driver, Hydra skipped the
   rest of the sweep and Ray cancelled every other job. Hydra accepts launchers only from the
   `hydra_plugins` package, so instead of a launcher of our own the plugin's module gets a
   `ray` whose `get` hands a lost job to Hydra as a job that returned nothing (as a job whose
   trial failed does). The sweep's counts and exit status come, as always, from the runs on
   the tracking server, where the parent marks the lost job's run FAILED.
2. A driver connecting to a loopback cluster needs RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, or
   Ray swaps 127.0.0.1 for the host's routable address and retries forever
   (src/harness/servers.py keeps its nodes on loopback the same way).
"""
from __future__ import annotations

import ipaddress
import logging
import os

log = logging.getLogger(__name__)


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
