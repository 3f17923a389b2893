"""The tool's commands run as a user runs them (`python -m MODULE ARGS`), without paying the
interpreter's start-up each time.

A fresh `python -m src.run ...` spends seconds importing torch, Hydra, MLflow and pandas before it
reads its first argument; the tests run a few hundred such commands. `run_command` hands each one to
a helper process (one per pytest worker, started on first use) that has imported those libraries
once and forks a child per command. The child is the command: its own process, with the argument
list, working folder, environment and `sys.path` a fresh interpreter would have, stdout and stderr
in files of its own, the module run as `__main__`, the interpreter's exit steps (threads joined,
`atexit` handlers) and its exit status (an uncaught exception: the traceback and 1; Ctrl-C: killed
by SIGINT, as CPython does). What it cannot give is a fresh interpreter's state: a module imported
by the helper is not imported again, so what a module does at import (read an environment
variable, set a warning filter) happens once, in the helper, with the environment set in
`HELPER_ENV`. A command run in another folder than the repository (another checkout's src/) or
not as `python -m` goes through `subprocess`; a test of import-time behaviour or of signals sent to
the command uses `subprocess` itself; `SPECSWEEP_TEST_FRESH=1` sends every command
through `subprocess` (the way to tell the helper from the code when a test fails only here).

tests/test_commands.py checks the two give the same result.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# what the tool's commands import before they read an argument (and src/run.py's environment for its imports)
PRELOAD = ("torch", "numpy", "pandas", "omegaconf", "hydra", "hydra.core.config_store", "mlflow",
           "mlflow.tracking", "sqlalchemy", "joblib", "tqdm", "filelock", "src.sweep", "src.door",
           # and what a model from a folder (model=hf) imports when it loads one: seconds a command
           "transformers", "transformers.models.auto.modeling_auto", "transformers.models.gpt2.modeling_gpt2",
           "transformers.models.llama.modeling_llama", "transformers.tokenization_utils_fast",
           "transformers.generation.utils")
HELPER_ENV = {"HYDRA_FULL_ERROR": "1", "MLFLOW_LOGGING_LEVEL": "WARNING", "HF_HUB_OFFLINE": "1",
              "TRANSFORMERS_OFFLINE": "1"}

_helper: subprocess.Popen | None = None
_pending = bytearray()   # what the helper wrote past the last line read


def run_command(cmd: list[str], *, cwd=None, env: dict | None = None, timeout: float | None = None,
                **ignored) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True)`, for a
    `cmd` of the form [sys.executable, "-m", MODULE, *args], through the helper (any other `cmd`,
    or SPECSWEEP_TEST_FRESH=1: through subprocess). Raises subprocess.TimeoutExpired as run does
    (the command killed first)."""
    cwd = str(cwd if cwd is not None else os.getcwd())
    env = dict(os.environ if env is None else env)
    if (len(cmd) < 3 or cmd[:2] != [sys.executable, "-m"] or Path(cwd).resolve() != REPO
            or os.environ.get("SPECSWEEP_TEST_FRESH") == "1"):   # another checkout's src/: a fresh interpreter
        return subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True)
    with tempfile.TemporaryDirectory(prefix="command-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        helper = _the_helper()
        helper.stdin.write((json.dumps({"module": cmd[2], "args": [str(a) for a in cmd[3:]], "cwd": cwd, "env": env,
                                        "out": str(out), "err": str(err)}) + "\n").encode())
        helper.stdin.flush()
        pid = int(_reply(helper, None)["pid"])
        try:
            code = int(_reply(helper, timeout)["returncode"])
        except subprocess.TimeoutExpired:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _reply(helper, None)   # the helper reaps it
            raise subprocess.TimeoutExpired(cmd, timeout, output=_read(out), stderr=_read(err)) from None
        return subprocess.CompletedProcess(cmd, code, _read(out), _read(err))


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace") if path.exists() else ""


def _the_helper() -> subprocess.Popen:
    global _helper
    if _helper is None or _helper.poll() is not None:
        _pending.clear()
        _helper = subprocess.Popen([sys.executable, "-m", "tests.commands"], cwd=REPO, bufsize=0,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   env={**os.environ, **HELPER_ENV})
        ready = _reply(_helper, 300)
        assert ready.get("ready"), ready
        atexit.register(_stop_helper, _helper)
    return _helper


def _stop_helper(helper: subprocess.Popen) -> None:
    helper.stdin.close()   # the helper's request loop ends
    try:
        helper.wait(timeout=10)
    except subprocess.TimeoutExpired:
        helper.kill()
        helper.wait()


def _reply(helper: subprocess.Popen, timeout: float | None) -> dict:
    """The helper's next line (unbuffered reads: a line already read is never waited for)."""
    fd = helper.stdout.fileno()
    deadline = None if timeout is None else time.monotonic() + timeout
    while b"\n" not in _pending:
        if deadline is not None:
            readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                raise subprocess.TimeoutExpired("helper", timeout)
        chunk = os.read(fd, 65536)
        if not chunk:
            raise RuntimeError(f"the command helper stopped (exit status {helper.wait()})")
        _pending.extend(chunk)
    end = _pending.index(b"\n")
    line = bytes(_pending[:end])
    del _pending[:end + 1]
    return json.loads(line)


# ---- the helper (python -m tests.commands) ----

def _serve() -> None:
    proto_in = os.fdopen(os.dup(0), "r")
    proto_out = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)          # nothing the helper's imports print reaches the protocol
    import importlib
    for name in PRELOAD:
        importlib.import_module(name)
    python_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path[1:] if p not in python_path]   # sys.path[0]: the helper's working folder
    proto_out.write(json.dumps({"ready": True}) + "\n")
    for line in proto_in:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            proto_in.close()
            proto_out.close()
            _child(request, base_path)
        proto_out.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        proto_out.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")


def _child(request: dict, base_path: list[str]) -> None:
    """Become `python -m MODULE ARGS` in the request's folder and environment; never returns."""
    import atexit
    import io
    import runpy
    import threading
    import traceback
    for fd, path in ((1, request["out"]), (2, request["err"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    python_path = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [request["cwd"], *python_path, *base_path]
    sys.argv = [request["module"], *request["args"]]
    code = 0
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:   # noqa: BLE001 - what the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()   # the interpreter's exit: non-daemon threads joined, then atexit
    except Exception:   # noqa: BLE001
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:   # noqa: BLE001
            pass
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


if __name__ == "__main__":
    _serve()
