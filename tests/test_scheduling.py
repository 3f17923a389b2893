"""How `make test` shares the suite among its workers (tests/conftest.py): the tests of the files
that start Ray clusters are one unit of work, so one worker runs them one after another; a file
whose module fixture does the work is one unit (the fixture runs once); every other test is a
unit of its own."""
from __future__ import annotations

from tests.conftest import ONE_FIXTURE_FILES, ONE_WORKER_FILES, REPO, work_unit


def test_the_cluster_files_are_one_unit_of_work_and_every_other_test_its_own():
    assert ONE_WORKER_FILES and all((REPO / "tests" / f).is_file() for f in ONE_WORKER_FILES)  # not renamed away
    units = {work_unit(f"tests/{f}::test_{i}[a-1]") for i, f in enumerate(ONE_WORKER_FILES)}
    assert units == {"one_worker"}
    for other in ("tests/engine/decoding/test_decode.py::test_greedy[bigram-1]", "tests/tools/test_bench_noise.py::test_x",
                  "tests/tools/test_cluster_helpers.py::test_y"):
        assert work_unit(other) == other
    for f in ONE_FIXTURE_FILES:
        assert (REPO / "tests" / f).is_file()
        assert {work_unit(f"tests/{f}::test_{i}") for i in range(3)} == {f"tests/{f}"}


def test_the_suite_runs_without_pytest_xdist():
    """The scheduler hook is xdist's own: with xdist not loaded, pytest still starts and runs a test
    (an unknown hook would stop it at start-up with an internal error)."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-q",
                           "tests/test_scheduling.py::test_the_cluster_files_are_one_unit_of_work_and_every_other_test_its_own"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
