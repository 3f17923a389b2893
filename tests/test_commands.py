"""tests/commands.py: a command run through the helper gives what a fresh interpreter gives
(exit status, stdout, stderr), for each way a command ends and for what it reads from its
environment, arguments and working folder."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.commands import REPO, run_command

PROBE = '''
import atexit, os, sys, threading, time
what = sys.argv[1]
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("PROBE_VALUE"), "main", __name__)
print("path", sys.path[:3])
print("to stderr", file=sys.stderr)
atexit.register(lambda: print("atexit ran"))
if what == "exit2":
    sys.exit(2)
if what == "message":
    sys.exit("error: a message")
if what == "raise":
    raise ValueError("boom")
if what == "interrupt":
    raise KeyboardInterrupt
if what == "thread":
    threading.Thread(target=lambda: (time.sleep(0.5), print("thread finished"))).start()
'''


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
    folder = tmp_path_factory.mktemp("commands") / "plugins"
    folder.mkdir()
    (folder / "command_probe.py").write_text(PROBE)
    return folder


@pytest.mark.parametrize("what", ["ok", "exit2", "message", "raise", "interrupt", "thread"])
def test_a_command_through_the_helper_ends_as_a_fresh_interpreter_does(plugins, what):
    env = dict(os.environ, PROBE_VALUE="seven", PYTHONPATH=os.pathsep.join([str(REPO), str(plugins)]))
    env.pop("SPECSWEEP_TEST_FRESH", None)
    cmd = [sys.executable, "-m", "command_probe", what, "x y"]
    fresh = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    helped = run_command(cmd, cwd=REPO, env=env, timeout=60)
    assert (helped.returncode, helped.stdout) == (fresh.returncode, fresh.stdout)
    # a traceback names the helper's frames too: compare its last line
    assert helped.stderr.splitlines()[0] == fresh.stderr.splitlines()[0] == "to stderr"
    assert helped.stderr.strip().splitlines()[-1] == fresh.stderr.strip().splitlines()[-1]
    assert "seven" in fresh.stdout and "atexit ran" in fresh.stdout   # the probe saw what it should


def test_a_refusal_of_the_tool_is_the_same_through_the_helper():
    cmd = [sys.executable, "-m", "src.run", "k=0"]
    env = {k: v for k, v in os.environ.items() if k != "SPECSWEEP_TEST_FRESH"}
    fresh = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    helped = run_command(cmd, cwd=REPO, env=env, timeout=120)
    assert fresh.returncode == 2 and fresh.stderr.startswith("error: ")
    assert (helped.returncode, helped.stdout, helped.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_a_command_past_its_timeout_is_killed_and_raises(plugins):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(plugins)]))
    (plugins / "command_sleep.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired) as stopped:
        run_command([sys.executable, "-m", "command_sleep"], cwd=REPO, env=env, timeout=1)
    assert stopped.value.output == "started\n"
    assert run_command([sys.executable, "-m", "command_probe", "ok"], cwd=REPO, env=env).returncode == 0   # the helper goes on
