"""Where things live: the repository root and the folders the code finds from it, whatever the
working directory a job was started in. It imports nothing of the project: any floor may use it."""
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONF_DIR = REPO / "conf"
SWEEPS_DIR = REPO / "sweeps"
