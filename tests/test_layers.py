"""The engine is one floor below the harness: it imports every module of src.engine with hydra,
omegaconf, mlflow and src.harness made unimportable, in a fresh interpreter."""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

PROBE = r"""
import importlib, pkgutil, sys
BLOCKED = ("hydra", "omegaconf", "mlflow", "src.harness")
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.startswith(BLOCKED):
            raise ImportError(f"the engine imported {name}")
sys.meta_path.insert(0, Block())
import src.engine
names = [m.name for m in pkgutil.walk_packages(src.engine.__path__, "src.engine.")]
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def test_engine_imports_no_harness_hydra_or_mlflow():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[-1]) >= 12  # every engine module was imported, drafts included


def test_the_negative_control_is_caught():
    """The probe itself can fail: a harness module does import hydra."""
    probe = PROBE.replace("import src.engine\n", "import src.engine\nimport src.harness.trial\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "ImportError" in proc.stderr
