"""A job's config derived from its group choices' base (src/sweep/compose.py) is exactly the
config Hydra composes for it, Hydra node included; what it cannot derive it composes."""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from src.sweep.compose import Compositions
from src.sweep.context import PublishedTarget, SweepContext
from src.sweep.compose import job_overrides
from tests.conftest import REPO

CONTEXT = SweepContext("abc", "paper", "inv", "run'1", "0", "sqlite:////tmp/x y/mlflow.db", "c0ffee+dirty.1", 60,
                       57, 1, 1.5e9, "host:12", (PublishedTarget("k1", "r1", "s" * 64),)).override()


def as_data(cfg):
    return OmegaConf.to_container(cfg, resolve=False)


@pytest.mark.parametrize("sweep,extra", [
    ("smoke", []),
    pytest.param("paper", ["temperature=0.5", "timing.pairs=3"], marks=pytest.mark.slow),
    pytest.param("paper", ["model=tiny", "train=quick", "n_chars=64"], marks=pytest.mark.slow),
])
def test_derived_configs_equal_hydras_own(sweep, extra):
    with initialize_config_dir(config_dir=str(REPO / "sweeps"), version_base="1.3"):
        master = compose(sweep, overrides=[f"hydra.searchpath=[file://{REPO / 'conf'}]", *extra],
                         return_hydra_config=True)
        loader = GlobalHydra.instance().config_loader()
        compositions = Compositions(loader, master)
        jobs = job_overrides(master)
        for overrides in jobs[:: max(1, len(jobs) // 12)] + [jobs[-1]]:
            for job in (overrides, overrides + [CONTEXT]):
                assert as_data(compositions.compose(job)) == as_data(loader.load_sweep_config(master, job)), job
        assert compositions.derived > compositions.composed   # one base per draft, the rest derived


def test_what_cannot_be_derived_is_composed_the_normal_way():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        master = compose("config", return_hydra_config=True)
        loader = GlobalHydra.instance().config_loader()
        compositions = Compositions(loader, master)
        for job in (["draft=int4", "hydra.job.chdir=false"], ["+extra=1"], ["timing={pairs:3}"], ["draft.bits=4"]):
            before = compositions.composed
            assert as_data(compositions.compose(job)) == as_data(loader.load_sweep_config(master, job)), job
            if job != ["draft.bits=4"]:
                assert compositions.composed == before + 1, job          # not derived
        with pytest.raises(Exception, match="nosuch"):                    # Hydra's own error
            compositions.compose(["nosuch=1"])


def test_serving_answers_hydra_only_for_its_master_and_stops():
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    original = ConfigLoaderImpl.load_sweep_config
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        master = compose("config", return_hydra_config=True)
        other = compose("config", return_hydra_config=True)
        loader = GlobalHydra.instance().config_loader()
        compositions = Compositions(loader, master)
        compositions.serve()
        try:
            checked = loader.load_sweep_config(master, ["k=2"])          # the sweeper's check
            assert checked.k == 2 and compositions.derived == 1
            assert loader.load_sweep_config(master, ["k=2"]) is checked   # the launcher: handed on
            assert loader.load_sweep_config(master, ["k=2"]) is not checked and compositions.derived == 2
            loader.load_sweep_config(other, ["k=2"])                      # another master: Hydra's own
            assert compositions.derived == 2
        finally:
            compositions.stop()
    assert ConfigLoaderImpl.load_sweep_config is original


def test_the_private_hydra_api_it_relies_on_is_there():
    """src/sweep/compose.py uses four private symbols of Hydra (its docstring says why): this
    fails, naming the one, when an upgrade removes one or changes how it is called."""
    import inspect

    from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    expected = {
        BasicSweeper.split_arguments: ["overrides", "max_batch_size"],
        ConfigLoaderImpl.load_sweep_config: ["self", "master_config", "sweep_overrides"],
        ConfigLoaderImpl._apply_overrides_to_config: ["overrides", "cfg"],
        get_overrides_dirname: ["overrides", "exclude_keys", "item_sep", "kv_sep"],
    }
    for fn, params in expected.items():
        assert list(inspect.signature(fn).parameters) == params, fn.__qualname__
