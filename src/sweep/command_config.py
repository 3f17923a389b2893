"""A tool's config and its work under the command line's rules: bad input (a SpecsweepError, or
Hydra's or OmegaConf's error) is one line and exit 2 (errors.refuse), never Hydra's report."""
from __future__ import annotations

from ..engine.errors import SpecsweepError, refuse
from ..paths import CONF_DIR
from ..trial.conf import check_group_choices, one_line


def refusing(fn, *args):
    """fn(*args), its bad-input errors refused in one line (exit 2)."""
    try:
        return fn(*args)
    except SpecsweepError as e:
        refuse(str(e))
    except Exception as e:  # noqa: BLE001 - a config error from Hydra: one line, not a traceback
        if type(e).__module__.split(".")[0] not in ("hydra", "omegaconf"):
            raise
        refuse(one_line(e))


def compose_or_refuse(overrides: list[str], then=None):
    """(the composed conf/config.yaml with `overrides`, then(cfg) or None), refusing bad input."""
    def run():
        from hydra import compose, initialize_config_dir
        check_group_choices(overrides)
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        return cfg, (then(cfg) if then is not None else None)
    return refusing(run)
