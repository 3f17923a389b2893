"""Every tool reads its arguments before any work: a bad one is one line on stderr (`error: ...`)
and exit status 2, before a corpus, a target or a sweep is touched.

Each tool runs in this process with its first piece of work replaced by a tripwire (loading the
target, running a sweep, starting a server); a bad argument must end the tool before the wire.
The negative control passes good arguments and sees the wire trip: the wire is on the path.
"""
from __future__ import annotations

import sys

import pytest


class Tripwire(BaseException):   # not an Exception: no tool's own error handler catches it
    """The tool started its work."""


def trip(*args, **kwargs):
    raise Tripwire


@pytest.fixture
def wired(monkeypatch):
    """The first piece of work of every tool, replaced by the tripwire."""
    import src.predict
    import analysis.report
    import src.bench.drafts
    import src.bench.noise
    import src.bench.predict_rounds
    import src.bench.policy_ceiling
    import src.bench.harness
    import src.bench.folder_model_size
    import src.bench.retrain
    import src.cluster.servers
    import src.export
    for module in (src.bench.drafts, src.bench.policy_ceiling, src.export):
        monkeypatch.setattr(module, "load_target", trip)
    monkeypatch.setattr(src.bench.retrain, "get_target", trip)
    monkeypatch.setattr(src.bench.folder_model_size, "write_model", trip)
    for module in (src.bench.harness, src.bench.noise):
        monkeypatch.setattr(module, "run_sweep", trip)
    monkeypatch.setattr(src.bench.noise, "CpuHog", trip)
    monkeypatch.setattr(src.bench.predict_rounds, "run_round", trip)
    monkeypatch.setattr(src.cluster.servers, "_load", trip)
    monkeypatch.setattr(analysis.report, "run", trip)
    monkeypatch.setattr(src.predict, "compose", trip)
    return {"drafts": src.bench.drafts.main, "ceiling": src.bench.policy_ceiling.main, "sweep": src.bench.harness.main,
            "noise": src.bench.noise.main, "servers": src.cluster.servers.main, "report": analysis.report.main,
            "predict": src.predict.main, "export": src.export.main, "retrain": src.bench.retrain.main,
            "folder": src.bench.folder_model_size.main, "bench-predict": src.bench.predict_rounds.main}


def call(monkeypatch, wired, tool: str, args: list[str]):
    """(exit status, stderr lines) of the tool on args; Tripwire when it started its work."""
    monkeypatch.setattr(sys, "argv", [tool, *args])
    main = wired[tool]
    try:
        status = (main(args) if tool in ("servers", "report", "predict", "noise", "export", "retrain", "folder",
                                     "bench-predict") else main())
    except SystemExit as e:
        status = e.code
    return status


CASES = [   # (tool, args, message)
    ("ceiling", ["--seqs", "0"], "--seqs: an integer >= 1, got 0"),
    ("ceiling", ["--every", "x"], "--every: an integer >= 1, got 'x'"),
    ("ceiling", ["--drafts", "bigram,nosuch"], "unknown draft 'nosuch' (available: bigram, distilled,"),
    ("ceiling", ["--cap", "100000"], "leaves no room in the context window"),
    ("ceiling", ["--prices", "a,b"], "--prices takes numbers"),
    ("drafts", ["--chars", "0"], "--chars: an integer >= 1"),
    ("drafts", ["--orders", "0-3"], "--orders takes context lengths >= 1"),
    ("drafts", ["--drafts", "bigram"], "--drafts takes ngram, distilled"),
    ("drafts", ["ngram.nosuch=1"], "takes no option nosuch"),
    ("sweep", ["--sweep", "nosuch"], "unknown sweep 'nosuch' (available: "),
    ("noise", ["--sweep", "nosuch"], "unknown sweep 'nosuch' (available: "),
    ("noise", ["--hog-cores", "-1"], "--hog-cores: an integer >= 0"),
    ("noise", ["--seeds", "0;1"], "--seeds takes seeds separated by commas"),
    ("servers", ["ray-up", "--num-cpus", "0"], "--num-cpus: an integer >= 1"),
    ("servers", ["tracking-up", "--pg-port", "70000"], "a port from 1 to 65535"),
    ("servers", ["nosuch"], "invalid choice: 'nosuch'"),
    ("report", ["--bootstrap", "-1"], "--bootstrap: an integer >= 0, got -1"),
    ("report", ["--nosuch"], "unrecognized arguments: --nosuch"),
    ("predict", ["--rounds", "0"], "--rounds: an integer >= 1, got 0"),
    ("predict", ["--runs", "x"], "--runs: an integer >= 1, got 'x'"),
    ("bench-predict", ["--sweep", "nosuch"], "unknown sweep 'nosuch' (available: "),
    ("bench-predict", ["--sweep", "smoke", "seed=1"], "seed= is set by this tool"),
    ("bench-predict", ["--sweep", "smoke", "--seeds", "0,1", "--probe-runs", "3"], "--probe-runs must be between 1"),
    ("bench-predict", ["--sweep", "smoke", "--", "--runs", "2"], "--runs is set by this tool"),
    ("bench-predict", ["--sweep", "smoke", "--", "batch=4"], "--validate takes each cell's engine and batch"),
    ("export", [], "the following arguments are required: folder (see --help)"),   # not "folder, overrides"
    ("export", ["{tmp}/used/config.json/sub"], "cannot create the export folder"),     # a folder under a file
    ("export", ["/proc/specsweep-export"], "cannot create the export folder"),          # where nothing can be made
    ("export", ["{tmp}/new", "model=nosuch"], "unknown model 'nosuch'"),
    ("export", ["{tmp}/new", "k=[1,2"], "bad override 'k=[1,2'"),
    ("export", ["{tmp}/used"], "is not an empty folder"),
    ("retrain", ["model=nosuch"], "unknown model 'nosuch'"),
    ("retrain", ["--nosuch"], "unrecognized arguments: --nosuch"),
    ("folder", ["--width", "100", "--heads", "12"], "must be a multiple of --heads"),
    ("folder", ["--context", "2000"], "exceeds --positions 1024"),
    ("folder", ["--engines", "eager,onnx"], "a comma-separated list of eager and compiled"),
]


@pytest.mark.parametrize("tool,args,message", CASES, ids=[f"{c[0]} {' '.join(c[1])}" for c in CASES])
def test_a_bad_argument_is_refused_before_any_work(monkeypatch, capsys, tmp_path, wired, tool, args, message):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "config.json").write_text("{}")
    status = call(monkeypatch, wired, tool, [a.format(tmp=tmp_path) for a in args])   # a Tripwire here: the tool worked before it refused
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert status == 2 and len(err) == 1 and err[0].startswith("error: ") and message in err[0], (status, err)


@pytest.mark.parametrize("tool,args", [("ceiling", ["--drafts", "bigram"]), ("drafts", ["--drafts", "ngram"]),
                                       ("sweep", ["--sweep", "smoke"]), ("noise", ["--sweep", "smoke"]),
                                       ("servers", ["status"]), ("report", []), ("predict", []),
                                       ("export", ["{tmp}/new"]), ("retrain", ["model=tiny", "data=synthetic"]),
                                       ("folder", []), ("bench-predict", ["--sweep", "smoke"])])
def test_the_negative_control_good_arguments_reach_the_work(monkeypatch, tmp_path, wired, tool, args):
    with pytest.raises(Tripwire):
        call(monkeypatch, wired, tool, [a.format(tmp=tmp_path) for a in args])
