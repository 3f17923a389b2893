"""Where things live: the repository root and the folders the code finds from it, whatever the
working directory a job was started in."""
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
CONF_DIR = REPO / "conf"
