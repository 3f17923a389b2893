"""The sweep: many trials as one experiment: configs (hydra), planning, launching, resume, tracking (mlflow).

It turns a composed config into engine calls and records what they measured.
"""

from .. import door  # noqa: F401  (its warning filter, before Hydra composes the launcher configs)
