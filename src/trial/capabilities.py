"""What runs with what: the one table of engines, policies and drafts that the trial's checks refuse
by (src/trial/spec.py) and from which every "what runs where" is generated: the table of
`python -m src.run --help`, the README's, the `# runs: ...` line of each conf/engine,
conf/policy, conf/draft file and conf/model/hf.yaml, and conf/config.yaml's option lists.

    python -m src.trial.capabilities            # print the table
    python -m src.trial.capabilities --write    # rewrite the help's, the README's and conf/'s copies

tests/trial/test_capabilities.py checks both ways: each combination of engine, verify, batch,
policy, draft and model runs or is refused as the table says, and every generated copy is current.

Engines, policies and verify modes are rows here; a draft's facts are its class's own
(src/engine/drafts/base.py: `batched`, `library`, `library_only`, `folder_targets`), read from the
class its conf/draft file names, and a draft whose model comes from a folder
(conf/draft/hf_model.yaml) runs only where a model from a folder runs, one sequence at a time.
"""
from __future__ import annotations

import functools
import importlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..engine.errors import SpecsweepError
from ..paths import CONF_DIR, REPO

TOOL, LIBRARY = "the tool's", "transformers'"   # whose loop runs both arms of a trial


@dataclass(frozen=True)
class Engine:
    name: str
    loop: str                      # TOOL or LIBRARY
    devices: tuple[str, ...]       # "cpu", "cuda"
    trees: bool                    # verify=tree (a model of the tool's)
    batch: bool                    # batch > 1
    folder: tuple[str, ...]        # what it verifies for a model from a folder (model=hf): () none, chain, tree
    policies: tuple[str, ...]      # the draft-length policies it runs


@dataclass(frozen=True)
class Policy:
    name: str
    trees: bool                    # with verify=tree
    batch: bool                    # at batch > 1


@dataclass(frozen=True)
class Verify:
    name: str
    batch: bool                    # at batch > 1


VERIFIES = (Verify("chain", batch=True), Verify("tree", batch=False))   # a batch decodes chains

POLICIES = (Policy("fixed", trees=True, batch=True),   # adaptive policies draft one chain of one sequence
            Policy("heuristic", trees=False, batch=False),
            Policy("confidence", trees=False, batch=False),
            Policy("cost", trees=False, batch=False))
ALL_POLICIES = tuple(p.name for p in POLICIES)

ENGINES = (
    Engine("eager", TOOL, ("cpu", "cuda"), trees=True, batch=True, folder=("chain", "tree"), policies=ALL_POLICIES),
    Engine("compiled", TOOL, ("cpu", "cuda"), trees=True, batch=True, folder=("chain",), policies=ALL_POLICIES),
    Engine("onnx", TOOL, ("cpu",), trees=True, batch=True, folder=(), policies=ALL_POLICIES),
    Engine("transformers", LIBRARY, ("cpu", "cuda"), trees=False, batch=False, folder=("chain",),
           policies=("fixed", "heuristic", "confidence")),   # those with a counterpart in generate
)


def engine(name: str) -> Engine:
    for e in ENGINES:
        if e.name == name:
            return e
    raise SpecsweepError(f"unknown engine {name!r} (available: {', '.join(e.name for e in ENGINES)})")


def policy(name: str) -> Policy:
    for p in POLICIES:
        if p.name == name:
            return p
    raise SpecsweepError(f"unknown policy {name!r} (available: {', '.join(ALL_POLICIES)})")


def verify(name: str) -> Verify:
    return next(v for v in VERIFIES if v.name == name)


def engines_where(test) -> list[str]:
    return [e.name for e in ENGINES if test(e)]


def or_list(names: list[str]) -> str:
    """a, b or c"""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def draft_class(path: str):
    """The class a conf/draft file's `_target_` names."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise SpecsweepError(f"draft class {path!r} cannot be imported ({e})") from None


@dataclass(frozen=True)
class Draft:
    """A draft's facts (its class's, and whether its model comes from a folder) and what follows."""
    name: str
    batched: bool                  # drafts for a batch of sequences
    library: str | None            # its counterpart in transformers' loop: "assistant", "prompt_lookup", None
    library_only: bool             # runs in transformers' loop only
    folder_targets: bool           # drafts for a model from a folder in the tool's loop
    from_folder: bool              # its own model comes from a folder (draft=hf_model)

    @classmethod
    @functools.lru_cache(maxsize=None)   # one trial's checks ask several times; a class's facts do not change
    def of(cls, name: str, cls_path: str, from_folder: bool) -> "Draft":
        c = draft_class(cls_path)
        return cls(name, bool(getattr(c, "batched", False)), getattr(c, "library", None),
                   bool(getattr(c, "library_only", False)), bool(getattr(c, "folder_targets", False)), from_folder)

    def runs_on(self, e: Engine) -> bool:
        if self.from_folder and not e.folder:
            return False
        return (not self.library_only) if e.loop == TOOL else self.library is not None

    def engines(self) -> list[str]:
        return engines_where(self.runs_on)

    def batch(self) -> bool:
        return self.batched and not self.from_folder   # a model from a folder decodes one sequence

    def policies(self, e: Engine) -> tuple[str, ...]:
        # prompt lookup drafts up to k tokens by its own rule: no policy of ours steers it
        return ("fixed",) if self.library == "prompt_lookup" else e.policies

    def for_folder_target(self, e: Engine) -> bool:
        """Drafts for a model from a folder (model=hf) on engine e."""
        if not (self.runs_on(e) and e.folder):
            return False
        if self.from_folder:
            return True
        return self.library_only if e.loop == LIBRARY else self.folder_targets


def conf_drafts() -> list[Draft]:
    """Every draft of conf/draft/, by its file."""
    out = []
    for path in sorted((CONF_DIR / "draft").glob("*.yaml")):
        node = yaml.safe_load(path.read_text())
        from_folder = any(isinstance(d, dict) and d.get("/model@model") == "hf" for d in node.get("defaults", []))
        out.append(Draft.of(path.stem, node["_target_"], from_folder))
    return out


# --- the generated copies ----------------------------------------------------------------------------

def verifies(names) -> str:
    """("chain", "tree") -> 'chains and trees'"""
    return " and ".join(f"{n}s" for n in names)


def engine_rows() -> list[list[str]]:
    drafts = conf_drafts()
    rows = []
    for e in ENGINES:
        rows.append([e.name, e.loop, ", ".join(e.devices), "chain, tree" if e.trees else "chain",
                     ", ".join(d.name for d in drafts if d.runs_on(e) and d.batch()) if e.batch else "no",
                     ", ".join(e.policies), ", ".join(d.name for d in drafts if d.runs_on(e)),
                     (f"{verifies(e.folder)}; drafts " + ", ".join(d.name for d in drafts if d.for_folder_target(e)))
                     if e.folder else "no"])
    return rows


ENGINE_HEADER = ["engine", "loop", "device", "verify", "batch > 1 (drafts)", "policy", "drafts", "model=hf"]
README_START = "<!-- what runs where: generated by `python -m src.trial.capabilities --write` -->"
README_END = "<!-- end of what runs where -->"
HELP_FILE = CONF_DIR / "hydra" / "help" / "specsweep.yaml"
HELP_START, HELP_END = "  == What runs where (src/trial/capabilities.py) ==", "  == Named sweeps"
RUNS = "# runs: "   # the generated line of a conf file


def markdown() -> str:
    lines = ["| " + " | ".join(ENGINE_HEADER) + " |", "|" + "---|" * len(ENGINE_HEADER)]
    lines += ["| " + " | ".join(f"`{r[0]}`" if i == 0 else c for i, c in enumerate(r)) + " |"
              for r in engine_rows()]
    return "\n".join(lines)


def help_block() -> str:
    out = []
    for r in engine_rows():
        out.append(f"    engine={r[0]}: {r[1]} loop; device {r[2]}; verify {r[3]}; batch > 1: {r[4]}; policy {r[5]}")
        out.append(f"        drafts: {r[6]}")
        out.append(f"        model=hf: {r[7]}")
    return "\n".join(out)


def conf_lines() -> dict[Path, str]:
    """conf file -> its generated `# runs: ` line."""
    out = {}
    drafts = conf_drafts()
    for e in ENGINES:
        out[CONF_DIR / "engine" / f"{e.name}.yaml"] = (
            f"{RUNS}{e.loop} loop on {', '.join(e.devices)}; verify={'chain or tree' if e.trees else 'chain'}; "
            f"batch {'>= 1' if e.batch else '= 1'}; policy={', '.join(e.policies)}; "
            f"model=hf: {verifies(e.folder) or 'no'} (src/trial/capabilities.py)")
    for p in POLICIES:
        out[CONF_DIR / "policy" / f"{p.name}.yaml"] = (
            f"{RUNS}engine={', '.join(engines_where(lambda e: p.name in e.policies))}; "
            f"verify={'chain or tree' if p.trees else 'chain'}; batch {'>= 1' if p.batch else '= 1'} "
            "(src/trial/capabilities.py)")
    for d in drafts:
        out[CONF_DIR / "draft" / f"{d.name}.yaml"] = (
            f"{RUNS}engine={', '.join(d.engines())}; batch {'>= 1' if d.batch() else '= 1'}; "
            f"model=hf: {', '.join(engines_where(d.for_folder_target)) or 'no'} (src/trial/capabilities.py)")
    folder = [e for e in ENGINES if e.folder]
    out[CONF_DIR / "model" / "hf.yaml"] = (
        f"{RUNS}batch = 1; " + "; ".join(
            f"engine={e.name} ({verifies(e.folder)}; drafts {', '.join(d.name for d in drafts if d.for_folder_target(e))})"
            for e in folder) + " (src/trial/capabilities.py)")
    return out


def group_lists(text: str) -> str:
    """conf/config.yaml with each group's option list (`- engine: eager   # eager | compiled ... (conf/engine/)`)
    in the table's order (the workloads in theirs)."""
    from .workload import WORKLOADS
    order = {"engine": [e.name for e in ENGINES], "policy": list(ALL_POLICIES), "verify": [v.name for v in VERIFIES],
             "workload": list(WORKLOADS)}

    def one(m: re.Match) -> str:
        return f"{m[1]}{' | '.join(order[m[2]])}{m[4]}"
    return re.sub(r"^(\s+- (\w+): \w+\s+# )([\w |]+?)( \(conf/\2/\))", lambda m: one(m) if m[2] in order else m[0],
                  text, flags=re.M)


def with_line(text: str, line: str) -> str:
    """A conf file's text with its `# runs: ` line replaced, or put after its leading comments."""
    lines = text.splitlines()
    for i, old in enumerate(lines):
        if old.startswith(RUNS):
            lines[i] = line
            return "\n".join(lines) + "\n"
    i = 0
    while i < len(lines) and lines[i].startswith("#"):
        i += 1
    return "\n".join(lines[:i] + [line] + lines[i:]) + "\n"


def between(text: str, start: str, end: str, block: str, where: str) -> str:
    if start not in text or end not in text:
        raise SpecsweepError(f"{where} lacks the markers {start!r} ... {end!r}")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{block}\n{end}{tail}"


def generated() -> dict[Path, str]:
    """Every file that holds a copy -> its text with the copy current."""
    out = {path: with_line(path.read_text(), line) for path, line in conf_lines().items()}
    config = CONF_DIR / "config.yaml"
    out[config] = group_lists(config.read_text())
    readme = REPO / "README.md"
    out[readme] = between(readme.read_text(), README_START, README_END, markdown(), "README.md")
    out[HELP_FILE] = between(HELP_FILE.read_text(), HELP_START, HELP_END, help_block() + "\n", str(HELP_FILE))
    return out


def main(argv: list[str]) -> int:
    from ..engine.atomic import write_text
    if "--write" in argv:
        for path, text in generated().items():
            if path.read_text() != text:
                write_text(path, text)
                print(f"rewrote {path.relative_to(REPO)}")
        return 0
    print(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
