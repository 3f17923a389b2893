"""Every job's config composed once in a sweep's parent, not three times.

Hydra composes each job of a multirun from scratch (defaults tree, YAML files, merges: about
0.15 s a job here), and in the sweep's parent it did so three times per job: the plan (which
validates every job before anything is written), the sweeper's check that every job composes,
and, at n_jobs=1, the launcher running the job in this process.

`Compositions` composes one *base* per distinct set of config-group choices (3 for the paper
sweep) and derives every job from its base: a copy with the job's value overrides (`k=4`,
`seed=2`, `sweep={...}`) applied by Hydra's own code, in the job's order, and the override lists
and `override_dirname` Hydra keeps for it. An override it cannot derive so (a group choice, an
add/delete, a package, a Hydra setting, a key that is not a leaf) makes it compose that job the
normal way, and so does any error (Hydra's own message comes out). `serve(...)` answers Hydra's
`load_sweep_config` from it in this process until `stop()`: the sweeper's check gets a derived
config and the launcher, asking next for the same job, gets that very config (the check only
looks at it). tests/sweep/test_compose.py checks that a derived config equals Hydra's own
composition, Hydra node included.

Why Hydra's private modules (hydra._internal, the only module here that imports them): Hydra
1.3 has no public API to expand a sweep into its jobs in the basic sweeper's order, to apply a
job's value overrides to a composed config, or to hand the launcher a config composed earlier.
The three symbols used (BasicSweeper.split_arguments, ConfigLoaderImpl.load_sweep_config and
ConfigLoaderImpl._apply_overrides_to_config, get_overrides_dirname) are pinned by
hydra-core==1.3.8 in requirements.txt; tests/sweep/test_compose.py fails when one of them is
gone or changes its signature, and when a derived config stops matching Hydra's own.
"""
from __future__ import annotations

import copy
import logging

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import Container, DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)

_MISSING = object()
_compose = ConfigLoaderImpl.load_sweep_config   # Hydra's own, also while `serve` is on
_serving: "Compositions | None" = None


def job_overrides(config: DictConfig) -> list[list[str]]:
    """The override list of every job, in Hydra's basic-sweeper order (job num = index)."""
    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    overrides = OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task))
    return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


class Compositions:
    def __init__(self, loader, master: DictConfig) -> None:
        self.loader, self.master = loader, master
        self.parser = OverridesParser.create()
        self.parsed: dict[str, object] = {}   # override line -> Hydra's Override (`sweep={...}` is long)
        self.bases: dict[tuple[str, ...], DictConfig] = {}
        self.pending: dict[tuple[str, ...], DictConfig] = {}   # served once, to be handed on once
        self.derived = self.composed = 0

    def compose(self, overrides: list[str]) -> DictConfig:
        """The config Hydra's `load_sweep_config(master, overrides)` gives."""
        try:
            cfg = self._derive(list(overrides))
        except Exception as e:  # whatever it is, Hydra's own composition says it properly
            log.debug("composing %s the normal way: %s", overrides, e)
            cfg = None
        if cfg is None:
            self.composed += 1
            return _compose(self.loader, self.master, list(overrides))
        self.derived += 1
        return cfg

    def _parse(self, line: str):
        if line not in self.parsed:
            self.parsed[line] = self.parser.parse_overrides([line])[0]
        return self.parsed[line]

    def _is_group(self, key: str) -> bool:
        return key in self.master.hydra.runtime.choices or self.loader.repository.group_exists(key)

    def _derive(self, overrides: list[str]) -> DictConfig | None:
        parsed = [self._parse(line) for line in overrides]
        groups, values = [], []
        for o in parsed:
            if o.is_sweep_override() or o.is_hydra_override() or o.package is not None or o.is_add() \
                    or o.is_force_add() or o.is_delete():
                return None
            (groups if self._is_group(o.key_or_group) else values).append(o)
        if any(not isinstance(o.value(), str) for o in groups):
            return None
        key = tuple(o.input_line for o in groups)
        base = self.bases.get(key)
        if base is None:
            base = self.bases[key] = _compose(self.loader, self.master, list(key))
        for o in values:  # only leaves of the base (a value, or null): never a node that groups fill
            current = OmegaConf.select(base, o.key_or_group, default=_MISSING, throw_on_missing=False)
            if current is _MISSING or isinstance(current, Container):
                return None
        cfg = copy.deepcopy(base)
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)   # as Hydra applies them: in order
        with open_dict(cfg.hydra):
            cfg.hydra.overrides.task = [o.input_line for o in parsed]
            dirname = cfg.hydra.job.config.override_dirname
            cfg.hydra.job.override_dirname = get_overrides_dirname(
                overrides=parsed, kv_sep=dirname.kv_sep, item_sep=dirname.item_sep,
                exclude_keys=dirname.exclude_keys)
        OmegaConf.copy_cache(from_config=self.master, to_config=cfg)
        return cfg

    def serve(self) -> None:
        """Answer Hydra's `load_sweep_config(master, ...)` in this process from here on."""
        global _serving
        _serving = self
        ConfigLoaderImpl.load_sweep_config = _load_sweep_config

    def stop(self) -> None:
        global _serving
        self.pending.clear()
        if _serving is self:
            _serving = None
            ConfigLoaderImpl.load_sweep_config = _compose

    def _serve(self, overrides: list[str]) -> DictConfig:
        """The second request for a job (the launcher's, after the sweeper's check) gets the
        config the first one got; a third composes again."""
        key = tuple(overrides)
        cfg = self.pending.pop(key, None)
        if cfg is None:
            cfg = self.pending[key] = self.compose(overrides)
        return cfg


def _load_sweep_config(loader, master_config, sweep_overrides):
    served = _serving
    if served is not None and loader is served.loader and master_config is served.master:
        return served._serve(list(sweep_overrides))
    return _compose(loader, master_config, sweep_overrides)
