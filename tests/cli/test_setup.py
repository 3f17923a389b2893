"""The set-up's CPU-only path: `make setup TORCH_INDEX=URL` installs torch from that index before
the pinned requirements (which the installed CPU build then satisfies); without it, pip's
configured index alone. Checked on make's dry run (-n -B: every command printed, none run)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from src.paths import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def setup_commands(*args: str) -> list[str]:
    out = subprocess.run(["make", "-n", "-B", "-C", str(REPO), "--no-print-directory", "setup", *args],
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if "pip install" in line]


def test_torch_comes_from_the_named_index_first_and_the_pins_after():
    pinned = re.search(r"^torch==\S+", (REPO / "requirements.txt").read_text(), re.M).group(0)
    cmds = setup_commands("TORCH_INDEX=https://example.invalid/whl/cpu")
    torch_at = [i for i, c in enumerate(cmds) if "--index-url https://example.invalid/whl/cpu" in c]
    reqs_at = [i for i, c in enumerate(cmds) if "-r requirements.txt" in c]
    assert len(torch_at) == 1 and cmds[torch_at[0]].endswith(" " + pinned)   # the pinned version, alone
    assert reqs_at and torch_at[0] < reqs_at[0]


def test_without_an_index_only_pips_own():
    cmds = setup_commands()
    assert not any("--index-url" in c for c in cmds) and any("-r requirements.txt" in c for c in cmds)
