"""The house's layout (docs/layout.md) and its import graph (every import, function-level ones included).

Floors, lowest first; a module imports only its own floor and the floors below:
    src.engine   torch and its runtimes only, in rooms, lowest first; a room imports only itself and
                 the rooms before it (ENGINE_ROOMS):
                   the root      errors, atomic, locks, sampling: what every room shares
                   models        corpus, tokenizer, model, train (and weights/), quantize, int8_linear
                   drafts        one file per draft
                   decoding      decode, tree, batch, policy: the loops
                   measuring     timing, intervals, measure, acceptance, replay, roofline, formula
                   runtimes      engines, onnx_engine: what runs a pass
                   huggingface   library_loop, folder_model, checkpoint: transformers in one corner
    src.trial    one cell: spec -> counters, costs, timings (no Hydra, no MLflow); predict's probes
    src.sweep    many cells: store, tracking, ledger, plan, compose, callbacks, job, launchers
    src.run      the command line
Beside them:
    src.paths    where things live: a leaf any floor but the engine may import
    src.door     the front door (every command's composing and one-line refusals): a leaf like src.paths,
                 which imports only src.paths and the engine's root (its errors)
    analysis     runs -> tables, cost models, figures, predictions. It reads runs and fits, and never
                 runs a model: nothing it imports imports torch (directly or through the project's
                 modules, at any depth of their code); of the floors it imports the engine's
                 torch-free modules, the leaves and the store rules (src.sweep.store), nothing else
    tools        src.bench, src.cluster, src.readme_example, src.export, src.predict: import anything;
                 nothing but a tool imports them
And: no import cycle anywhere in src/ and analysis/; no two modules there share a file name; no
module imports another module's private (`_name`) names.
"""
from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

from src.paths import REPO

FLOORS = ["src.engine", "src.trial", "src.sweep", "src.run"]
ROOTS = ("src", "analysis")   # the two top packages: empty __init__ files every module passes through
TOOLS = ("src.bench", "src.cluster", "src.readme_example", "src.export", "src.predict")
LEAVES = ("src.paths", "src.door")
LEAF_MAY = ("src.paths", "src.door", "src.engine.errors")   # what a leaf imports
ANALYSIS_MAY = ("src.engine", "src.paths", "src.door", "src.sweep.store", "analysis")
ENGINE_ROOMS = ["src.engine", "src.engine.models", "src.engine.drafts", "src.engine.decoding",
                "src.engine.measuring", "src.engine.runtimes", "src.engine.huggingface"]   # lowest first; the
                # first is the root: the engine's modules outside every sub-package
RUNS_MODELS = ("torch",)   # a module that imports it runs models: analysis reaches none
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


@functools.lru_cache(maxsize=None)   # the negative controls change one module's source: the others are read once
def parsed(source: str) -> ast.Module:
    return ast.parse(source)


@functools.lru_cache(maxsize=None)
def imports_of(name: str, source: str, is_package: bool) -> frozenset[str]:
    """Every module `name` imports, at any depth of its code, relative imports resolved."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(parsed(source)):
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
    return frozenset(found)


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


def room_of(name: str) -> int | None:
    """The engine room of a module (its index in ENGINE_ROOMS), None outside the engine."""
    found = None
    for i, room in enumerate(ENGINE_ROOMS):
        if under(name, room):
            found = i
    return found


def runs_models(sources: dict[str, str], graph: dict[str, set[str]]) -> set[str]:
    """The modules that import torch, anywhere in their code, or import a module that does."""
    out = {n for n, src in sources.items()
           if any(target and target.split(".")[0] in RUNS_MODELS for target in imports_of(n, src, False))}
    grew = True
    while grew:
        grew = False
        for name, edges in graph.items():
            if name not in out and edges & out:
                out.add(name)
                grew = True
    return out


def violations(sources: dict[str, str]) -> list[str]:
    """Every import against the layer rule, as 'importer -> imported: why'."""
    out = []
    graph = import_graph(sources)
    for name, edges in graph.items():
        tool = any(under(name, t) for t in TOOLS)
        for target in sorted(edges):
            if any(under(target, t) for t in TOOLS) and not tool:
                out.append(f"{name} -> {target}: only a tool imports a tool")
            elif name in LEAVES:
                if target not in LEAF_MAY and target != "src.engine":   # (the package errors sits in)
                    out.append(f"{name} -> {target}: a leaf imports only {', '.join(LEAF_MAY)}")
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
                elif room_of(name) is not None and room_of(target) is not None and room_of(target) > room_of(name):
                    out.append(f"{name} -> {target}: {ENGINE_ROOMS[room_of(name)]} imports only its room and the "
                               "rooms before it")
            else:
                out.append(f"{name}: not on a floor, not a tool, not analysis")
    models = runs_models(sources, graph)
    for name in sorted(models):
        if under(name, "analysis"):
            reached = sorted(t for t in graph[name] if t in models) or [m for m in RUNS_MODELS]
            out.append(f"{name} -> {reached[0]}: analysis never runs a model (nothing it imports imports torch)")
    for name in sources:
        if under(name, "src.engine") and name != "src.engine" and name.count(".") > 2 and \
                not any(name.startswith(room + ".") or name == room for room in ENGINE_ROOMS[1:]):
            out.append(f"{name}: in no room of ENGINE_ROOMS")
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


@pytest.mark.slow
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
        ("src.engine.models.model", "from ..decoding.decode import generate_baseline",
         "src.engine.models.model -> src.engine.decoding"),                         # a room above its own
        ("src.engine.drafts.base", "from ..measuring.measure import proposal", "src.engine.drafts.base -> src.engine.measuring"),
        ("analysis.prediction", "import torch", "analysis.prediction -> torch: analysis never runs a model"),
        ("analysis.prediction", "from src.trial.probes import measure_probes", "analysis.prediction -> src.trial.probes: "
         "analysis never runs a model"),
        ("analysis.prediction", "from src.engine.measuring.timing import timed",   # the engine, but the clock's module
         "analysis.prediction -> src.engine.measuring.timing: analysis never runs a model"),
        ("analysis.prediction", "from src.trial.spec import trial_spec", "analysis.prediction -> src.trial: analysis imports only"),
        ("src.door", "from .sweep.store import check_store", "src.door -> src.sweep.store: a leaf imports only"),
    ]:
        planted = dict(base, **{module: base[module] + f"\ndef _planted():\n    {line}\n"})
        found = violations(planted)
        assert any(f.startswith(expect) for f in found), (line, found)
        assert all(f.startswith(module + " -> ") for f in found), (line, found)


def test_a_module_in_no_room_of_the_engine_is_caught():
    planted = dict(project_sources(), **{"src.engine.extra": "", "src.engine.extra.thing": "x = 1\n"})
    assert violations(planted) == ["src.engine.extra.thing: in no room of ENGINE_ROOMS"]


def shared_file_names(paths: list[Path]) -> dict[str, list[str]]:
    """file name -> the modules of that name, for every name two modules share (packages' __init__ aside)."""
    names: dict[str, list[str]] = {}
    for path in paths:
        if path.name != "__init__.py":
            names.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    return {name: where for name, where in names.items() if len(where) > 1}


def test_no_two_modules_share_a_file_name():
    """A name says its concept: src/ and analysis/ hold one module of each file name."""
    paths = sorted(p for root in ROOTS for p in (REPO / root).rglob("*.py"))
    assert len(paths) > 80 and shared_file_names(paths) == {}
    planted = paths + [REPO / "analysis" / "load.py"]   # the negative control: a second load.py
    assert shared_file_names(planted) == {"load.py": ["src/trial/load.py", "analysis/load.py"]}


def private_imports(sources: dict[str, str]) -> list[str]:
    """Every use of another module's private name (`_name`, not dunders): imported from a module of
    the project, or read as an attribute of a project module imported whole."""
    packages = {n for n in sources if any(m.startswith(n + ".") for m in sources)}
    out = []
    for name, src in sources.items():
        package = name if name in packages else name.rpartition(".")[0]
        tree = parsed(src)
        modules = {}   # local name -> the project module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    base = package.split(".")
                    module = ".".join(base[:len(base) - (node.level - 1)] + ([node.module] if node.module else []))
                if module not in sources:
                    continue
                for a in node.names:
                    if f"{module}.{a.name}" in sources:
                        modules[a.asname or a.name] = f"{module}.{a.name}"
                    elif a.name.startswith("_") and not a.name.startswith("__"):
                        out.append(f"{name} imports {a.name} from {module}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in sources and a.asname:
                        modules[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                out.append(f"{name} reads {node.attr} of {modules[node.value.id]}")
    return out


def test_no_module_imports_another_modules_private_names():
    base = project_sources()
    assert private_imports(base) == []
    for module, line, expect in [   # the negative controls
        ("src.engine.decoding.tree", "from .decode import _planted", "src.engine.decoding.tree imports _planted from "
         "src.engine.decoding.decode"),
        ("src.trial.checks", "from ..engine.huggingface import checkpoint\n    checkpoint._hidden()",
         "src.trial.checks reads _hidden of src.engine.huggingface.checkpoint"),
        ("analysis.report", "import src.sweep.store as store\n    store._x", "analysis.report reads _x of src.sweep.store"),
    ]:
        planted = dict(base, **{module: base[module] + f"\ndef _planted():\n    {line}\n"})
        assert private_imports(planted) == [expect], line


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
