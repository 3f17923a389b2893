"""Targets travel through the tracking server: trained once, published once, fetched and verified.

A target run (`specsweep.kind = target`) holds the checkpoint `checkpoint/target-<key>.pt`, its
sha256 as the tag `sha256`, and its training facts. The server is the truth for a key: the
oldest FINISHED target run of that key is *the* target, and a local checkpoint of the same key
with other bytes is replaced by the server's. A sweep's parent trains (or loads) each target
and publishes it before any job starts; workers only fetch, verify and load (`PublishedTargets`,
the trial's target source in a worker): they never train.
"""
from __future__ import annotations

import logging
import tempfile
from dataclasses import asdict
from pathlib import Path

from ..engine.atomic import atomic_path, write_text
from ..engine.errors import SpecsweepError
from ..engine.locks import COPY_WAIT_S, file_lock
from ..engine.atomic import file_sha256
from ..engine.models.train import TrainedTarget
from ..trial.load import TargetSource, cached_target, get_target_cached, target_key_and_path
from ..trial.spec import TargetSpec, is_folder_model
from .context import PublishedTarget, SweepContext
from .store import KIND_TAG, TARGET
from .tracking import environment_tags, store_lock

log = logging.getLogger(__name__)


def checkpoint_artifact(key: str) -> str:
    return f"checkpoint/target-{key}.pt"


def find_target_run(client, experiment_id: str, key: str):
    """The oldest FINISHED target run of `key`, or None."""
    runs = client.search_runs([experiment_id], f"tags.`{KIND_TAG}` = '{TARGET}' and tags.target_key = '{key}' "
                              "and attributes.status = 'FINISHED'", max_results=1,
                              order_by=["attributes.start_time ASC"])
    return runs[0] if runs else None


def _published_sha(client, run) -> str:
    sha = run.data.tags.get("sha256")
    if sha:
        return sha
    # a target run logged before the tag existed: its checksum file is an artifact beside it
    with tempfile.TemporaryDirectory() as tmp:
        key = run.data.tags["target_key"]
        path = client.download_artifacts(run.info.run_id, checkpoint_artifact(key) + ".sha256", tmp)
        return Path(path).read_text().strip()


def fetch_checkpoint(client, published: PublishedTarget, path: Path) -> None:
    """Download the published checkpoint into `path` (atomically, with its sidecar) after
    checking its sha256; a download that does not match is refused, the old file stays."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        got = Path(client.download_artifacts(published.run_id, checkpoint_artifact(published.key), tmp))
        sha = file_sha256(got)
        if sha != published.sha256:
            raise SpecsweepError(f"target {published.key} from run {published.run_id} has sha256 {sha[:12]}..., "
                                 f"the server records {published.sha256[:12]}...: download corrupt")
        with atomic_path(path) as dst:
            got.replace(dst)
        write_text(path.with_name(path.name + ".sha256"), sha + "\n")


def _ensure_local_copy(client, published: PublishedTarget, path: Path) -> bool:
    """Make the local checkpoint the published bytes; True if it had to be fetched."""
    with file_lock(str(path) + ".lock", f"the local copy of target {published.key}", COPY_WAIT_S):
        if path.is_file() and file_sha256(path) == published.sha256:
            return False
        if path.is_file():
            log.warning("local checkpoint %s differs from the published target %s: replacing it with the server's",
                        path, published.key)
        fetch_checkpoint(client, published, path)
        return True


def publish_target(client, experiment_id: str, uri: str, target: TrainedTarget, spec: TargetSpec) -> PublishedTarget:
    """The target run of `target.key`: the existing one (whose bytes then replace a differing
    local copy), or a new one with this checkpoint."""
    from mlflow.entities import Metric, Param, RunStatus, RunTag
    with store_lock(uri):
        folder = is_folder_model(spec.model)   # model=hf: its folder is read where it lies, nothing is uploaded
        run = find_target_run(client, experiment_id, target.key)
        if run is not None:
            published = PublishedTarget(target.key, run.info.run_id, _published_sha(client, run))
            if not folder:
                _ensure_local_copy(client, published, Path(target.path))
            return published
        sha = target.sha256 if folder else file_sha256(Path(target.path))
        tags = {KIND_TAG: TARGET, "target_key": target.key, "sha256": sha, **environment_tags()}
        if folder:
            tags["model_path"] = str(target.path)
        rid = client.create_run(experiment_id, run_name=f"target-{target.key}", tags=tags).info.run_id
        params = {f"model.{k}": str(v) for k, v in spec.model.items()}
        params.update({f"train.{k}": str(v) for k, v in asdict(spec.train).items()})
        params.update({"train_seed": str(spec.train_seed), "corpus": str(spec.data.path or spec.data.source)})
        if folder:
            client.log_batch(rid, params=[Param(k, v) for k, v in params.items()],
                             metrics=[Metric("n_params", target.model.n_params(), 0, 0)])
        else:
            client.log_batch(rid, params=[Param(k, v) for k, v in params.items()],
                             metrics=[Metric("val_loss", target.val_loss, 0, 0),
                                      Metric("n_params", target.model.n_params(), 0, 0)],
                             tags=[RunTag("checkpoint_bytes", str(Path(target.path).stat().st_size))])
            client.log_artifact(rid, str(target.path), "checkpoint")
            client.log_artifact(rid, str(target.path) + ".sha256", "checkpoint")
        client.set_terminated(rid, RunStatus.to_string(RunStatus.FINISHED))
        log.info("published target %s as run %s (sha256 %s...)", target.key, rid, sha[:12])
        return PublishedTarget(target.key, rid, sha)


class PublishedTargets(TargetSource):
    """A sweep worker's targets: the ones its sweep's parent published, fetched from the server
    when this host lacks those exact bytes. Never trains. A process that loaded those very
    bytes for an earlier job, from a file unchanged since, reuses them."""

    def __init__(self, ctx: SweepContext, client):
        self.ctx, self.client = ctx, client
        self.fetched: set[str] = set()   # keys of the targets this source downloaded

    def target(self, corpus, spec: TargetSpec, progress: bool = True) -> TrainedTarget:
        key, path = target_key_and_path(corpus, spec)
        published = self.ctx.target(key)
        if published is None:
            known = ", ".join(t.key for t in self.ctx.targets) or "none"
            raise SpecsweepError(f"this host computes target {key}, the sweep's parent published {known}: "
                                 "its corpus or code differ from the parent's")
        if is_folder_model(spec.model):   # read from its folder, which must still hold the published digest
            return get_target_cached(corpus, spec, progress=False, train_if_missing=False, sha256=published.sha256)
        target = cached_target(path, published.sha256)
        if target is not None:
            return target
        if _ensure_local_copy(self.client, published, path):
            self.fetched.add(key)
        target = get_target_cached(corpus, spec, progress=False, train_if_missing=False, sha256=published.sha256)
        if target.sha256 != published.sha256:  # replaced between the check and the load
            raise SpecsweepError(f"target {key}: the checkpoint {path} changed while it was loaded; run the job again")
        return target
