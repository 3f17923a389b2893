"""What conf/ offers: the options of each config group, and a check of the group choices on a
command line before Hydra sees them (its message for an unknown option is a multi-line wall)."""
from __future__ import annotations

from ..engine.errors import SpecsweepError
from ..paths import CONF_DIR


def group_options(group: str) -> list[str]:
    """The options of a config group (its conf/<group>/*.yaml), sorted; [] for no such group."""
    folder = CONF_DIR / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def check_group_choices(args: list[str]) -> None:
    """Refuse `draft=nosuch` (or `-m draft=bigram,nosuch`) with one sentence naming the options."""
    for arg in args:
        key, sep, value = arg.partition("=")
        group = key.lstrip("+~")
        if not sep or "." in group or "@" in group or not (CONF_DIR / group).is_dir():
            continue
        options = group_options(group)
        for choice in value.split(","):
            if choice and choice not in options:
                raise SpecsweepError(f"unknown {group} {choice!r} (available: {', '.join(options)})")
