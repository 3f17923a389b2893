"""What the analysis commands share at their entry point: bad input as one line, exit status 2."""
from __future__ import annotations

import logging

from mlflow.exceptions import MlflowException

from src.engine.errors import SpecsweepError, error_line


def one_line_errors(command) -> int:
    """Run command() with warnings-only logging; bad input (a SpecsweepError or MlflowException)
    ends as one line `error: ...` on stderr and exit status 2 (python -m analysis.report and
    python -m src.predict)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # MLflow gives its logger an INFO handler of its own at import; its INFO lines (e.g. the
    # pool class inherited from a sweep's environment) would bury a one-line error.
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    try:
        command()
    except (SpecsweepError, MlflowException) as e:
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        error_line(str(message))
        return 2
    return 0
