"""Stopping a sweep's processes (src/sweep/processes.py): each gets SIGTERM and the time to act on
it; one that ignores SIGTERM (a resource tracker) is not waited for, and gets SIGKILL."""
from __future__ import annotations

import subprocess
import sys

from src.paths import REPO

SCRIPT = r'''
import signal, subprocess, sys, time
from src.sweep.processes import alive, ignores, stop_descendants

deaf = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                         "print('ready', flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
polite = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                           "def bye(*_):\n    time.sleep(0.5)\n    open(sys.argv[1], 'w').write('done')\n    sys.exit(0)\n"
                           "signal.signal(signal.SIGTERM, bye); print('ready', flush=True); time.sleep(600)",
                           sys.argv[1]], stdout=subprocess.PIPE, text=True)
assert deaf.stdout.readline() == polite.stdout.readline() == "ready\n"
print(ignores(deaf.pid, signal.SIGTERM), ignores(polite.pid, signal.SIGTERM))
stopped = stop_descendants(grace=600)   # waiting for the deaf one would take all of it
for _ in range(200):                    # SIGKILL lands a moment after it is sent
    if not alive(deaf.pid):
        break
    time.sleep(0.05)
print(sorted(stopped) == sorted([deaf.pid, polite.pid]), alive(deaf.pid), alive(polite.pid))
'''


def test_a_process_that_ignores_sigterm_is_killed_without_waiting_and_the_others_stop_on_their_own(tmp_path):
    said = tmp_path / "polite"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(said)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)   # far below the 600 s grace: the deaf process was not waited for
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["True False", "True False False"]
    assert said.read_text() == "done"   # the polite one finished its SIGTERM handler (half a second): it was waited for
