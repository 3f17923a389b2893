"""A workload: the prompts a trial generates from, each with its category and its length.

Whether speculation pays depends on what is generated, so a trial runs a workload, not one
prompt (`workload=`, conf/workload/): every prompt is decoded from the trial's seed, its
counters kept per prompt and per category, and both arms timed over all of them
(src/trial/trial.py). The workloads:

- `single` (the default): the config's `prompt`, `n_chars` chars after it; one prompt in
  category `single`: the trial of every earlier version of the tool.
- `validation`: windows of the corpus's validation split (the text the target never trained
  on), `per_category` of each layout category, `prompt_chars` long, `n_chars` generated after
  each, drawn by `workload.seed`. A window's category is what the text that follows it in the
  corpus (as many chars as are generated) is made of, read off its lines (`layout_category`):
  `stage` (a line opening with `[`, `ACT `, `SCENE `, `Enter`, `Exit` or `Exeunt`), else
  `dialogue` (two speaker tags or more: a line of capitals ending in a full stop), else `prose`
  (a line after the first that opens lower-case: the line broke mid-sentence), else `verse`.
  In a corpus that lacks a category (another text than the default), that category is absent.
- `copy`: `prompts` passages of the validation split, each shown once, then a blank line, then
  its first `restart_chars` again: the continuation can copy the passage (where the field's
  prompt lookup wins); category `copy`.
- `file`: a JSONL file of the user's (`workload.path`): one JSON object a line with `prompt`,
  optional `category` (else `uncategorized`) and optional `n_chars` (else `workload.n_chars`,
  else the config's `n_chars`). Spec-Bench's `question.jsonl` and MT-Bench's question files are
  read as they are: `turns` (a list of user turns) stands for `prompt`, its first turn the
  prompt. Blank lines are skipped; other keys (`question_id`, `reference`, ...) are ignored.

A built-in workload is drawn with Python's own `random.Random(seed)` (the same on every machine
and version) from the corpus, in milliseconds; `digest` names a workload's prompts exactly.
For a model from a folder (model=hf) the prompts are encoded with its tokenizer and `n_chars`
counts tokens.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..engine.errors import SpecsweepError

WORKLOADS = ("single", "validation", "copy", "file")
OPTIONS = {"single": (), "validation": ("per_category", "prompt_chars", "n_chars", "seed"),
           "copy": ("prompts", "passage_chars", "restart_chars", "n_chars", "seed"),
           "file": ("path", "n_chars")}
UNCATEGORIZED = "uncategorized"
LAYOUT = ("verse", "prose", "dialogue", "stage")    # validation's categories, in table order
MAX_DRAWS = 200                                     # windows drawn per prompt wanted before giving up


@dataclass(frozen=True)
class Prompt:
    text: str
    category: str
    n_chars: int        # chars (a model from a folder: tokens) to generate after it
    where: str          # how a refusal names it: "the prompt", "line 7 of FILE", "verse window 3"
    offset: int | None = None   # a built-in prompt's first char in the validation split


@dataclass(frozen=True)
class WorkloadSpec:
    name: str                                 # single | validation | copy | file
    options: dict                             # its conf/workload options
    prompts: tuple[Prompt, ...] | None        # known from the config (single, file); None: drawn from the corpus

    @property
    def longest(self) -> int:
        """The most chars a prompt plus its generation takes (the context window must hold it plus k)."""
        if self.prompts is not None:
            return max(len(p.text) + p.n_chars for p in self.prompts)
        o = self.options
        if self.name == "validation":
            return o["prompt_chars"] + o["n_chars"]
        return o["passage_chars"] + 2 + o["restart_chars"] + o["n_chars"]


def _integer(name: str, value, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise SpecsweepError(f"{name} must be an integer >= {lo}, got {value!r}")
    return value


def workload_spec(node, prompt: str, n_chars: int, resolve_path=Path) -> WorkloadSpec:
    """conf/workload's node as a WorkloadSpec, every option checked (one sentence if bad); a
    file is read and checked here, whole, before any work. prompt and n_chars: the config's."""
    if not isinstance(node, Mapping) or "name" not in node:
        raise SpecsweepError("the config lacks workload.name")
    name = node["name"]
    if name not in WORKLOADS:
        raise SpecsweepError(f"unknown workload {name!r} (available: {', '.join(WORKLOADS)})")
    extra = sorted(set(node) - set(OPTIONS[name]) - {"name"})
    if extra:
        raise SpecsweepError(f"workload {name} has unknown keys: {', '.join(extra)} "
                             f"(known: {', '.join(OPTIONS[name]) or 'none'})")
    missing = [key for key in OPTIONS[name] if key not in node]
    if missing:
        raise SpecsweepError(f"the config lacks workload.{missing[0]} (conf/workload/{name}.yaml)")
    options = {key: node[key] for key in OPTIONS[name]}
    if name == "single":
        return WorkloadSpec(name, options, (Prompt(prompt, "single", n_chars, "the prompt"),))
    if name == "file":
        default_n = n_chars if options["n_chars"] is None else _integer("workload.n_chars", options["n_chars"], 1)
        path = options["path"]
        if not isinstance(path, str) or not path:
            raise SpecsweepError("workload=file needs workload.path=FILE: a JSONL file of prompts "
                                 '(one {"prompt": ..., "category": ...} a line, or Spec-Bench / MT-Bench questions)')
        path = resolve_path(path)
        options["path"] = str(path)
        return WorkloadSpec(name, options, read_prompt_file(path, default_n))
    for key in OPTIONS[name]:
        _integer(f"workload.{key}", options[key], 0 if key == "seed" else 1)
    if name == "copy" and options["restart_chars"] >= options["passage_chars"]:
        raise SpecsweepError(f"workload.restart_chars ({options['restart_chars']}) must be below "
                             f"workload.passage_chars ({options['passage_chars']}): the prompt restarts the passage")
    return WorkloadSpec(name, options, None)


def read_prompt_file(path: Path, default_n: int) -> tuple[Prompt, ...]:
    """Every prompt of a JSONL file (see the module's docstring), or one sentence naming the first
    thing wrong with it (the file, or the line and what it lacks)."""
    where = f"workload.path {path}"
    if not path.exists():
        raise SpecsweepError(f"{where}: no such file")
    if not path.is_file():
        raise SpecsweepError(f"{where} is not a regular file: give a JSONL file of prompts")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SpecsweepError(f"{where} cannot be read: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecsweepError(f"{where} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        at = f"line {number} of {path.name}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecsweepError(f"{where}: {at} is not JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise SpecsweepError(f"{where}: {at} is not a JSON object")
        prompts.append(prompt_of(row, at, where, default_n))
    if not prompts:
        raise SpecsweepError(f"{where} holds no prompts: one JSON object a line, e.g. "
                             '{"prompt": "Once upon a time", "category": "story"}')
    metric_names({p.category for p in prompts}, where)
    return tuple(prompts)


def prompt_of(row: dict, at: str, where: str, default_n: int) -> Prompt:
    """One line's prompt: `prompt`, else the first of `turns` (Spec-Bench, MT-Bench)."""
    if "prompt" in row:
        text = row["prompt"]
    elif "turns" in row:
        turns = row["turns"]
        if not isinstance(turns, list) or not turns:
            raise SpecsweepError(f"{where}: {at} has `turns` that is not a non-empty list of strings")
        text = turns[0]
    else:
        raise SpecsweepError(f'{where}: {at} has neither "prompt" nor "turns"')
    if not isinstance(text, str) or not text:
        raise SpecsweepError(f"{where}: {at} has a prompt that is not a non-empty string: {text!r:.60}")
    category = row.get("category", UNCATEGORIZED)
    if not isinstance(category, str) or not category.strip():
        raise SpecsweepError(f"{where}: {at} has a category that is not a non-empty string: {category!r:.60}")
    n = row.get("n_chars", default_n)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise SpecsweepError(f"{where}: {at} has n_chars {n!r}: give a positive integer (chars, or tokens for "
                             "model=hf, to generate)")
    return Prompt(text, category.strip(), n, at)


def metric_name(category: str) -> str:
    """A category as it names metrics (`speedup.<name>`): MLflow's letters, digits, `_`, `-`, `.`, `/`."""
    return re.sub(r"[^A-Za-z0-9_\-./]", "_", category)


def metric_names(categories: set[str], where: str) -> dict[str, str]:
    """category -> its metric name; two categories that would name the same metrics are refused."""
    names: dict[str, str] = {}
    for c in sorted(categories):
        if c == "overall":
            raise SpecsweepError(f"{where}: a category is named 'overall', which names the whole workload: rename it")
        other = next((o for o, m in names.items() if m == metric_name(c)), None)
        if other is not None:
            raise SpecsweepError(f"{where}: categories {other!r} and {c!r} would log the same metrics "
                                 f"({metric_name(c)!r}): rename one")
        names[c] = metric_name(c)
    return names


TAG = re.compile(r"[A-Z][A-Z0-9' ,&\-]*\.")                        # a speaker tag line: "PANDARUS."
DIRECTION = re.compile(r"\s*(\[|ACT |SCENE |Enter\b|Exit\b|Exeunt\b)")   # a stage direction or a heading


def layout_category(lines: list[str]) -> str:
    """The layout category of the text in `lines` (see the module's docstring)."""
    lines = [line for line in lines if line.strip()]
    if any(DIRECTION.match(line) for line in lines):
        return "stage"
    tags = [line for line in lines if TAG.fullmatch(line.strip())]
    if len(tags) >= 2:
        return "dialogue"
    body = [line for line in lines if not TAG.fullmatch(line.strip())]
    if any(line[:1].islower() for line in body[1:]):
        return "prose"
    return "verse"


def whole_lines(text: str, start: int, end: int) -> list[str]:
    """The lines of `text` that overlap [start, end)."""
    a = text.rfind("\n", 0, start) + 1
    b = text.find("\n", end)
    return text[a:len(text) if b < 0 else b].split("\n")


def line_start(text: str, at: int) -> int:
    """The start of the first non-blank line at or after `at` (at itself when no newline follows)."""
    if at > 0 and text[at - 1] != "\n":
        nl = text.find("\n", at)
        if nl < 0:
            return at
        at = nl + 1
    while at < len(text) and text[at] == "\n":
        at += 1
    return at


def draw_windows(val: str, span: int, wanted: int, seed: int, accept):
    """Non-overlapping windows [s, s + span) of `val`, each starting at a line start, drawn by
    random.Random(seed) until accept(s) has said yes `wanted` times or MAX_DRAWS x wanted draws."""
    if len(val) < span:
        raise SpecsweepError(f"the validation split ({len(val):,} chars) is shorter than one workload window "
                             f"({span} chars): use a larger corpus or smaller workload sizes")
    rng, taken = random.Random(seed), []
    for _ in range(MAX_DRAWS * wanted):
        s = line_start(val, rng.randrange(0, len(val) - span + 1))
        if s + span > len(val) or any(s < t + span and t < s + span for t in taken):
            continue
        if accept(s):
            taken.append(s)
            if len(taken) == wanted:
                break
    return taken


def validation_prompts(val: str, per_category: int, prompt_chars: int, n_chars: int, seed: int) -> list[Prompt]:
    """`per_category` windows of each layout category (fewer where the text lacks them), in LAYOUT
    order, each in the order drawn."""
    span = prompt_chars + n_chars
    chosen: dict[str, list[int]] = {c: [] for c in LAYOUT}

    def accept(s: int) -> bool:
        c = layout_category(whole_lines(val, s + prompt_chars, s + span))
        if len(chosen[c]) < per_category:
            chosen[c].append(s)
            return True
        return False
    draw_windows(val, span, per_category * len(LAYOUT), seed, accept)
    out = []
    for c in LAYOUT:
        out += [Prompt(val[s:s + prompt_chars], c, n_chars, f"{c} window {i + 1}", s) for i, s in enumerate(chosen[c])]
    return out


def copy_prompts(val: str, prompts: int, passage_chars: int, restart_chars: int, n_chars: int, seed: int) -> list[Prompt]:
    """`prompts` passages, each shown, then a blank line, then its first restart_chars again."""
    starts = draw_windows(val, passage_chars, prompts, seed, lambda s: True)
    return [Prompt(val[s:s + passage_chars] + "\n\n" + val[s:s + restart_chars], "copy", n_chars, f"passage {i + 1}", s)
            for i, s in enumerate(starts)]


def workload_prompts(spec: WorkloadSpec, val: str) -> list[Prompt]:
    """The workload's prompts; `val` is the corpus's validation split (the built-in workloads'
    source). Refused in one sentence where the split yields none."""
    if spec.prompts is not None:
        return list(spec.prompts)
    o = spec.options
    if spec.name == "validation":
        out = validation_prompts(val, o["per_category"], o["prompt_chars"], o["n_chars"], o["seed"])
    else:
        out = copy_prompts(val, o["prompts"], o["passage_chars"], o["restart_chars"], o["n_chars"], o["seed"])
    if not out:
        raise SpecsweepError(f"workload={spec.name}: no window fits the validation split ({len(val):,} chars)")
    return out


def digest(prompts: list[Prompt]) -> str:
    """The workload's prompts, categories and lengths, exactly, as 16 hex digits."""
    blob = json.dumps([[p.category, p.text, p.n_chars] for p in prompts], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def categories(prompts: list[Prompt]) -> list[str]:
    """The categories in the order they first appear."""
    return list(dict.fromkeys(p.category for p in prompts))
