"""The house's layer rule and its import graph (every import, function-level ones included).

Floors, lowest first; a module imports only its own floor and the floors below:
    src.engine   torch and its runtimes only: model, drafts, sampling, decoding, timing
    src.trial    one cell: spec -> counters, costs, timings (no Hydra, no MLflow)
    src.sweep    many cells: store, tracking, ledger, plan, compose, callbacks, job, launchers
    src.run      the command line
Beside them:
    src.paths    where things live: a leaf any floor but the engine may import
    analysis     sweeps -> tables, cost models, figures; imports the engine, the trial, src.paths
                 and the store rules (src.sweep.store), nothing else of the sweep and not the CLI
    tools        src.bench, src.cluster, src.readme_example, src.export, src.predict: import anything; nothing but a tool
                 imports them
And no import cycle anywhere in src/ and analysis/.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from src.paths import REPO

FLOORS = ["src.engine", "src.trial", "src.sweep", "src.run"]
ROOTS = ("src", "analysis")   # the two top packages: empty __init__ files every module passes through
TOOLS = ("src.bench", "src.cluster", "src.readme_example", "src.export", "src.predict")
LEAVES = ("src.paths",)
ANALYSIS_MAY = ("src.engine", "src.trial", "src.paths", "src.sweep.store", "analysis")
# third-party packages a floor must not import
FORBIDDEN = {"src.engine": ("hydra", "omegaconf", "mlflow"), "src.trial": ("hydra", "omegaconf", "mlflow")}


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def project_sources() -> dict[str, str]:
    """module name -> source, for every module of src/ and analysis/ (packages as their __init__)."""
    out = {}
    for root in ("src", "analysis"):
        for path in sorted((REPO / root).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path.read_text()
    return out


def imports_of(name: str, source: str, is_package: bool) -> set[str]:
    """Every module `name` imports, at any depth of its code, relative imports resolved."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)  # `from pkg import submodule`
    return found


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """module -> the project modules it imports: the named module, and the packages above it
    that Python runs first (those that are not the importer's own packages)."""
    packages = {n for n in sources if any(m.startswith(n + ".") for m in sources)}
    graph = {}
    for name, src in sources.items():
        edges = set()
        for target in imports_of(name, src, name in packages):
            if target not in sources:
                continue
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                step = ".".join(parts[:i])
                if step in sources and step not in ROOTS and step != name and not under(name, step):
                    edges.add(step)
        graph[name] = edges
    return graph


def floor_of(name: str) -> int | None:
    for i, floor in enumerate(FLOORS):
        if under(name, floor):
            return i
    return None


def violations(sources: dict[str, str]) -> list[str]:
    """Every import against the layer rule, as 'importer -> imported: why'."""
    out = []
    graph = import_graph(sources)
    for name, edges in graph.items():
        tool = any(under(name, t) for t in TOOLS)
        for target in sorted(edges):
            if any(under(target, t) for t in TOOLS) and not tool:
                out.append(f"{name} -> {target}: only a tool imports a tool")
            elif tool or any(under(target, leaf) for leaf in LEAVES) and floor_of(name) != 0:
                continue
            elif under(name, "analysis"):
                if not any(under(target, ok) for ok in ANALYSIS_MAY) and target != "src.sweep":  # (the package
                    # src.sweep.store sits in: its __init__ runs first, and holds only a warning filter)
                    out.append(f"{name} -> {target}: analysis imports only {', '.join(ANALYSIS_MAY)}")
            elif floor_of(name) is not None:
                below = floor_of(target)
                if below is None or below > floor_of(name):
                    out.append(f"{name} -> {target}: {FLOORS[floor_of(name)]} imports only its floor and below")
            else:
                out.append(f"{name}: not on a floor, not a tool, not analysis")
    for name, src in sources.items():
        for floor, banned in FORBIDDEN.items():
            if under(name, floor):
                for target in imports_of(name, src, False):
                    if target and target.split(".")[0] in banned:
                        out.append(f"{name} -> {target}: {floor} imports no {target.split('.')[0]}")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_import_keeps_the_layer_rule():
    sources = project_sources()
    assert len([n for n in sources if floor_of(n) is not None]) > 40  # the floors were found
    assert violations(sources) == []


def test_no_import_cycle():
    assert cycles(import_graph(project_sources())) == []


def test_planted_imports_are_caught():
    """The negative controls: each planted import is reported (with the package above it that
    Python runs first), and nothing else is."""
    base = project_sources()
    for module, line, expect in [
        ("src.engine.models.model", "from src.sweep import store", "src.engine.models.model -> src.sweep.store"),
        ("src.trial.spec", "import mlflow", "src.trial.spec -> mlflow"),
        ("src.trial.trial", "from ..sweep.job import run_job", "src.trial.trial -> src.sweep.job"),
        ("analysis.prediction", "from src.sweep.job import run_job", "analysis.prediction -> src.sweep.job"),
        ("analysis.report", "import src.run", "analysis.report -> src.run"),
        ("src.sweep.job", "from ..bench import hog", "src.sweep.job -> src.bench.hog"),
    ]:
        planted = dict(base, **{module: base[module] + f"\ndef _planted():\n    {line}\n"})
        found = violations(planted)
        assert any(f.startswith(expect) for f in found), (line, found)
        assert all(f.startswith(module + " -> ") for f in found), (line, found)


def test_a_planted_cycle_is_caught():
    base = project_sources()
    planted = dict(base, **{"src.trial.spec": base["src.trial.spec"] + "\nfrom . import trial\n"})
    found = cycles(import_graph(planted))
    assert len(found) == 1 and {"src.trial.spec", "src.trial.trial"} <= set(found[0])


PROBE = r"""
import importlib, pkgutil, sys
BLOCKED = ("hydra", "omegaconf", "mlflow", "src.sweep", "src.run", "analysis")
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.startswith(BLOCKED):
            raise ImportError(f"a low floor imported {name}")
sys.meta_path.insert(0, Block())
import src.engine, src.trial
names = [m.name for pkg in (src.engine, src.trial) for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def test_engine_and_trial_run_without_hydra_mlflow_or_the_sweep():
    """In a fresh interpreter with hydra, omegaconf, mlflow and the sweep made unimportable."""
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[-1]) >= 18  # every engine and trial module was imported, drafts included


def test_the_probe_catches_a_blocked_import():
    probe = PROBE.replace("import src.engine, src.trial\n", "import src.engine, src.trial\nimport src.sweep.job\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "ImportError" in proc.stderr
