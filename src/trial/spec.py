"""The trial specification: the composed config of one cell, resolved and checked once.

`trial_spec(config)` turns a composed config (Hydra's DictConfig, or any mapping of the same
shape: conf/config.yaml and its groups) into a frozen `TrialSpec`, refusing every bad value
with one sentence (`SpecsweepError`) before any work is done. The trial and everything below
it take the spec, never the config: each setting is read here, in one place, from the config
(every value a run uses comes from conf/; a required key the config lacks is refused, never filled in
here; the dataclass defaults below serve specs built by hand, as in the tests).

What is not part of a trial (where it is tracked, the sweep it is in, resume) is left to the
sweep; `sweep_name`, `resume`, `sweep`, `tracking` and Hydra's own node are not read here.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..engine.errors import SpecsweepError
from ..engine.measuring.timing import cost_round_options, timing_options
from ..engine.models.train import TrainConfig
from ..engine.decoding.tree import check_widths, max_nodes
from ..paths import REPO
from . import capabilities as can
from .capabilities import draft_class
from .workload import WorkloadSpec, workload_spec


@dataclass(frozen=True)
class DataSpec:
    source: str                  # shakespeare | synthetic (ignored when path is set)
    path: Path | None            # a UTF-8 text file, absolute; None: the source
    cache_dir: Path              # corpus, models and drafts cache, absolute
    synthetic_chars: int | None  # length of the synthetic text (data=synthetic)
    max_vocab: int               # a corpus with more distinct chars is refused (src/trial/checks.py)


@dataclass(frozen=True)
class TargetSpec:
    """What determines a trained target: corpus, model shape, training, seed."""
    data: DataSpec
    model: dict                  # the model's shape (ModelConfig's fields but vocab_size)
    train: TrainConfig
    train_seed: int

    def identity(self) -> str:
        """Equal for specs that train the same target (the plan trains each one once)."""
        return repr((self.data, sorted(self.model.items()), self.train, self.train_seed))


@dataclass(frozen=True)
class DraftSpec:
    name: str
    cls: str                     # the draft class, `module.Class` (the config's `_target_`)
    options: dict                # the class's own keyword arguments from its conf/draft file
    model: TargetSpec | None     # a model draft's own trained model (`draft.model`), else None


@dataclass(frozen=True)
class TimingSpec:
    pairs: int                   # the minimum of alternated pairs
    pair_options: dict           # paired_timing's keywords: target_width, level, max_pairs, max_seconds
    cost_reps: int               # calls per component-time block
    cost_options: dict           # measure_cost's keywords: width, level, max_rounds, max_seconds
    free_loop: bool              # chains: time the free loop and the baseline loop with the components
    lock: bool                   # one timed phase per host at a time
    lock_dir: Path | None        # where the host's lock file lives; None: the system's temp folder


@dataclass(frozen=True)
class EngineSpec:
    name: str                    # eager | compiled | onnx | transformers (src/engine/runtimes/engines.py)
    mode: str | None             # torch.compile's mode
    options: dict                # inductor options


@dataclass(frozen=True)
class PolicySpec:
    name: str                    # fixed | heuristic | confidence | cost (src/engine/decoding/policy.py)
    options: dict                # its conf/policy options


FIXED_POLICY = PolicySpec("fixed", {})


@dataclass(frozen=True)
class TrialSpec:
    target: TargetSpec
    draft: DraftSpec
    k: int                       # drafted chars per pass (a tree: its depth)
    tree: tuple[int, ...] | None  # verify=tree: the widths per depth; None: a chain
    seed: int
    n_chars: int
    temperature: float
    prompt: str
    threads: int
    device: str
    timing: TimingSpec
    engine: EngineSpec
    exactness_samples: int | None  # the seed's first-char TVD check: its samples, None when off
    batch: int = 1               # sequences decoded together (src/engine/decoding/batch.py); 1: one sequence
    policy: PolicySpec = FIXED_POLICY  # the draft-length policy; k is its cap
    workload: WorkloadSpec | None = None  # the prompts (src/trial/workload.py); None: `prompt` alone (single)

    def __post_init__(self):
        if self.workload is None:   # a spec built by hand: the single workload of its prompt
            object.__setattr__(self, "workload", workload_spec({"name": "single"}, self.prompt, self.n_chars))

    @property
    def label(self) -> str:
        """The cell as a run is named: <draft>-k<k>-s<seed>, a tree's <draft>-tree<widths>-s<seed>,
        a batch's <draft>-k<k>-b<B>-s<seed>, an adaptive policy's <draft>-<policy>-k<cap>-s<seed>, a
        workload's other than single <draft>-k<k>-<workload>-s<seed>."""
        shape = f"tree{tree_label(self.tree)}" if self.tree else f"k{self.k}"
        batch = f"-b{self.batch}" if self.batch > 1 else ""
        policy = f"-{self.policy.name}" if self.policy.name != "fixed" else ""
        workload = f"-{self.workload.name}" if self.workload.name != "single" else ""
        return f"{self.draft.name}{policy}-{shape}{batch}{workload}-s{self.seed}"

    @property
    def drafted_per_pass(self) -> int:
        """The most chars (nodes) a pass drafts: k for a chain, the full tree's nodes."""
        return max_nodes(self.tree) if self.tree else self.k


def tree_label(widths) -> str:
    """A tree shape as a short label: (4, 2, 2, 1) -> '4-2-2-1'."""
    return "-".join(map(str, widths))


def plain(value):
    """A config value as plain Python: mappings to dicts, sequences (not strings) to lists."""
    if isinstance(value, Mapping):
        return {str(key): plain(v) for key, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [plain(v) for v in value]
    return value


def repo_path(p: str | Path) -> Path:
    """Relative paths in the config are relative to the repository root, wherever the job runs."""
    p = Path(p)
    return p if p.is_absolute() else REPO / p


class _Reader:
    """Reads a config node key by key; a key the node lacks is one sentence naming it."""

    def __init__(self, node, where: str = ""):
        self.node, self.where = node, where

    def __getitem__(self, key: str):
        try:
            return self.node[key]
        except (KeyError, TypeError, AttributeError):
            raise SpecsweepError(f"the config lacks {self.where}{key}") from None

    def sub(self, key: str) -> "_Reader":
        value = self[key]
        if not isinstance(value, Mapping):
            raise SpecsweepError(f"{self.where}{key} must be a config group, got {value!r}")
        return _Reader(value, f"{self.where}{key}.")


def integer(name: str, value, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise SpecsweepError(f"{name} must be an integer >= {lo}, got {value!r}")
    return value


def number(name: str, value, lo: float, open_lo: bool = False) -> float:
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
        or value < lo or (open_lo and value == lo)
    if bad:
        raise SpecsweepError(f"{name} must be a number {'>' if open_lo else '>='} {lo}, got {value!r}")
    return float(value)


def boolean(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise SpecsweepError(f"{name} must be true or false, got {value!r}")
    return value


def text(name: str, value, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not allow_empty and not value):
        raise SpecsweepError(f"{name} must be a non-empty string, got {value!r}")
    return value


def data_spec(node) -> DataSpec:
    d = _Reader(node, "data.")
    path = d["path"]
    if path is not None:
        path = repo_path(text("data.path", str(path)))
    source = text("data.source", d["source"])
    if path is None and source not in ("shakespeare", "synthetic"):
        raise SpecsweepError(f"unknown data.source {source!r} (shakespeare or synthetic; or set data.path)")
    synthetic = node.get("synthetic_chars") if isinstance(node, Mapping) else None
    if synthetic is not None:
        integer("data.synthetic_chars", synthetic, 1)
    elif source == "synthetic" and path is None:
        raise SpecsweepError("data.source=synthetic needs data.synthetic_chars (conf/data/synthetic.yaml)")
    return DataSpec(source, path, repo_path(text("data.cache_dir", str(d["cache_dir"]))), synthetic,
                    integer("data.max_vocab", d["max_vocab"], 2))


MODEL_KEYS = ("block_size", "n_layer", "n_head", "d_model", "dropout")
FOLDER_MODEL_KEYS = ("source", "path", "max_len")   # model=hf: a transformers checkpoint from a folder


def is_folder_model(model: dict) -> bool:
    """A target (or draft model) spec's model is a checkpoint from a folder (model=hf), not trained here."""
    return model.get("source") == "hf"


def folder_model(node, where: str = "model") -> dict:
    """model=hf: {source, path (absolute), max_len, block_size (the config's context window, capped
    by max_len)}; the folder is checked to hold a checkpoint, its config read (no weights loaded)."""
    from ..engine.huggingface.folder_model import check_folder, context_window
    extra = sorted(set(node) - set(FOLDER_MODEL_KEYS))
    if extra:
        raise SpecsweepError(f"{where}=hf has unknown keys: {', '.join(extra)} (known: {', '.join(FOLDER_MODEL_KEYS)})")
    path = node.get("path")
    if not isinstance(path, str) or not path:
        raise SpecsweepError(f"{where}=hf needs {where}.path=DIR: the folder of a transformers checkpoint "
                             "(config.json, weights, tokenizer)")
    folder = repo_path(path)
    check_folder(folder)
    max_len = node.get("max_len")
    if max_len is not None:
        integer(f"{where}.max_len", max_len, 2)
    window = context_window(folder)
    if window is None and max_len is None:
        raise SpecsweepError(f"{where}.path {folder}: its config names no context window; set {where}.max_len")
    block = min(v for v in (window, max_len) if v is not None)
    return {"source": "hf", "path": str(folder), "max_len": max_len, "block_size": block}


def draft_facts(draft: "DraftSpec") -> can.Draft:
    """The capability table's facts of a draft (its class's, and whether its model is from a folder)."""
    return can.Draft.of(draft.name, draft.cls, draft.model is not None and is_folder_model(draft.model.model))


def check_folder_target(target: "TargetSpec", draft: "DraftSpec", engine: "EngineSpec", tree, batch: int) -> None:
    """What a model from a folder runs here, by the capability table (src/trial/capabilities.py):
    one sequence, on the engines that run one, verifying what each verifies for it, with the
    drafts that draft for it there; a draft model from a folder on the same engines. Anything else
    in one line; an architecture that does not honour a tree's 4D mask is refused when the model
    is loaded (HFModel.setup_cache)."""
    facts, e = draft_facts(draft), can.engine(engine.name)
    folder_engines = can.engines_where(lambda x: bool(x.folder))
    if facts.from_folder and not e.folder:
        raise SpecsweepError(f"draft {draft.name!r}: a draft model from a folder runs on engine={', '.join(folder_engines)} "
                             f"here, not engine={engine.name}")
    if not is_folder_model(target.model):
        return
    if not e.folder:
        raise SpecsweepError(f"model=hf runs on engine={can.or_list(folder_engines)} here, not engine={engine.name}")
    if tree is not None and e.trees and "tree" not in e.folder:   # (an engine of chains: check_engine says it)
        trees = can.engines_where(lambda x: "tree" in x.folder)
        raise SpecsweepError(f"model=hf with engine={engine.name} verifies chains (a static cache takes no tree mask "
                             f"here): use verify=chain, or verify=tree on engine={can.or_list(trees)}")
    if batch > 1:
        raise SpecsweepError(f"model=hf decodes one sequence at a time here: use batch=1, not batch={batch}")
    if facts.for_folder_target(e):
        return
    fit = [d.name for d in can.conf_drafts() if d.for_folder_target(e)]
    if e.loop == can.LIBRARY:
        raise SpecsweepError(f"draft {draft.name!r} has no counterpart in transformers' generate for model=hf: use "
                             f"draft={can.or_list(fit)} (hf_model: draft.model.path=DIR)")
    raise SpecsweepError(f"draft {draft.name!r} reads the tool's own model, which model=hf is not: use "
                         f"draft={can.or_list(fit)} (hf_model: a model from a folder, draft.model.path=DIR)")


def model_shape(node, where: str = "model") -> dict:
    if isinstance(node, Mapping) and node.get("source") is not None:
        if node.get("source") != "hf":
            raise SpecsweepError(f"{where}.source must be hf (a checkpoint from a folder) or absent, "
                                 f"got {node.get('source')!r}")
        return folder_model(node, where)
    m = _Reader(node, f"{where}.")
    shape = {key: m[key] for key in MODEL_KEYS}
    for key in ("block_size", "n_layer", "n_head", "d_model"):
        integer(f"{where}.{key}", shape[key], 1)
    number(f"{where}.dropout", shape["dropout"], 0.0)
    if shape["d_model"] % shape["n_head"]:
        raise SpecsweepError(f"{where}.d_model ({shape['d_model']}) must be a multiple of {where}.n_head "
                             f"({shape['n_head']})")
    extra = sorted(set(node) - set(MODEL_KEYS))
    if extra:
        raise SpecsweepError(f"{where} has unknown keys: {', '.join(extra)} (known: {', '.join(MODEL_KEYS)})")
    return shape


def train_config(node) -> TrainConfig:
    known = list(TrainConfig.__dataclass_fields__)
    t = _Reader(node, "train.")
    values = {key: t[key] for key in known}
    for key in ("steps", "batch_size", "eval_interval", "eval_batches"):
        integer(f"train.{key}", values[key], 1)
    integer("train.warmup_steps", values["warmup_steps"], 0)
    for key in ("lr", "min_lr", "weight_decay", "grad_clip"):
        number(f"train.{key}", values[key], 0.0)
    vf = number("train.val_fraction", values["val_fraction"], 0.0, open_lo=True)
    if vf >= 1:
        raise SpecsweepError(f"train.val_fraction must be in (0, 1), got {vf!r}")
    extra = sorted(set(node) - set(known))
    if extra:
        raise SpecsweepError(f"train has unknown keys: {', '.join(extra)}")
    return TrainConfig(**values)


def target_spec(config, model_node=None) -> TargetSpec:
    """The target of `config`; with model_node, the same corpus, training and seed with that model."""
    c = _Reader(config)
    return TargetSpec(data_spec(c.sub("data").node), model_shape(model_node if model_node is not None else
                                                                 c.sub("model").node),
                      train_config(c.sub("train").node), integer("train_seed", c["train_seed"], 0))


# keyword arguments the trial supplies itself (src/trial/load.py: build_draft), never from conf/draft
SUPPLIED = ("target", "train_ids", "cache_dir", "target_key", "model")


def draft_spec(node, config=None) -> DraftSpec:
    """A conf/draft node as a DraftSpec; a model draft's own model needs the trial's `config`
    (its corpus, training and train_seed). The class must exist and take every option."""
    d = _Reader(node, "draft.")
    name = text("draft.name", d["name"])
    cls_path = text("draft._target_", d["_target_"])
    options = {key: plain(v) for key, v in node.items() if key not in ("_target_", "name", "model")}
    cls = draft_class(cls_path)
    accepted = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
    unknown = sorted(key for key in options if key not in accepted and not takes_any)
    if unknown:
        raise SpecsweepError(f"draft {name!r}: {cls.__name__} takes no option {', '.join(unknown)}")
    missing = sorted(k for k, p in accepted.items() if p.kind is p.KEYWORD_ONLY and p.default is p.empty
                     and k not in options and k not in SUPPLIED)
    if missing:
        raise SpecsweepError(f"draft {name!r}: conf/draft lacks {', '.join(missing)} ({cls.__name__} needs them)")
    try:
        cls.check_options(**options)
    except (ValueError, TypeError) as e:
        raise SpecsweepError(f"draft {name!r}: {e}") from None
    supplied = sorted(key for key in options if key in SUPPLIED)
    if supplied:
        raise SpecsweepError(f"draft {name!r}: {', '.join(supplied)} is supplied by the trial, not by conf/draft")
    model = None
    if isinstance(node.get("model"), Mapping):
        if config is None:
            raise SpecsweepError(f"draft {name!r} has a model of its own: it needs the trial's config")
        model = target_spec(config, node["model"])
    return DraftSpec(name, cls_path, options, model)


def tree_widths(config, k: int) -> tuple[int, ...] | None:
    """The tree's widths for verify=tree, None for the chain; a bad shape, or a k other than the
    tree's depth, is refused in one line."""
    v = _Reader(config).sub("verify")
    name = v["name"]
    if name == "chain":
        return None
    if name != "tree":
        raise SpecsweepError(f"unknown verify {name!r} (chain or tree)")
    try:
        shape = check_widths(plain(v["widths"]), "verify.widths")
    except ValueError as e:
        raise SpecsweepError(str(e)) from None
    if k != len(shape):
        raise SpecsweepError(f"verify=tree: k ({k}) must equal the tree's depth, len(verify.widths) = "
                             f"{len(shape)} for widths {list(shape)}; set k={len(shape)}")
    return shape


def timing_spec(node) -> TimingSpec:
    t = _Reader(node, "timing.")
    pairs = integer("timing.pairs", t["pairs"], 1)
    pair_options = timing_options(t["target_width"], t["confidence"], t["max_pairs"], t["max_seconds"])
    if pair_options["max_pairs"] is not None and pair_options["max_pairs"] < pairs:
        raise SpecsweepError(f"timing.max_pairs ({pair_options['max_pairs']}) is below timing.pairs ({pairs}): "
                             "the cap would never apply; raise it or lower timing.pairs")
    cost_options = cost_round_options(t["cost_width"], t["confidence"], t["cost_max_rounds"], t["cost_max_seconds"])
    lock_dir = t["lock_dir"]
    return TimingSpec(pairs, pair_options, integer("timing.cost_reps", t["cost_reps"], 1), cost_options,
                      boolean("timing.free_loop", t["free_loop"]), boolean("timing.lock", t["lock"]),
                      None if lock_dir is None else repo_path(text("timing.lock_dir", str(lock_dir))))


def engine_spec(node) -> EngineSpec:
    from ..engine.runtimes.engines import ENGINES
    e = _Reader(node, "engine.")
    name = e["name"]
    if name not in ENGINES:
        raise SpecsweepError(f"unknown engine {name!r} (available: {', '.join(ENGINES)})")
    mode = node.get("mode") if isinstance(node, Mapping) else None
    options = plain(node.get("options") or {}) if isinstance(node, Mapping) else {}
    if mode is not None and not isinstance(mode, str):
        raise SpecsweepError(f"engine.mode must be a string or null, got {mode!r}")
    if not isinstance(options, dict):
        raise SpecsweepError(f"engine.options must be a mapping, got {options!r}")
    if mode is not None and options:  # torch.compile takes one or the other
        raise SpecsweepError("engine.mode and engine.options cannot both be set: torch.compile takes a mode "
                             "or inductor options (set engine.options={} to use a mode)")
    if name == "compiled":
        import torch._inductor.config as inductor
        unknown = sorted(k for k in options if not hasattr(inductor, k))
        if unknown:
            raise SpecsweepError(f"engine.options: torch._inductor.config has no {', '.join(unknown)}")
        for key, value in options.items():   # a value of another type than the option's default is refused
            default = getattr(inductor, key)
            kind = type(default)
            if kind in (bool, int, float, str) and not (
                    type(value) is kind or (kind is float and type(value) is int)):
                raise SpecsweepError(f"engine.options.{key} must be a {kind.__name__} (its default is {default!r}), "
                                     f"got {value!r}")
    return EngineSpec(name, mode, options)


def trial_spec(config) -> TrialSpec:
    """The composed config as a TrialSpec, every value checked (one sentence if bad)."""
    c = _Reader(config)
    k = integer("k", c["k"], 1)
    tree = tree_widths(config, k)
    n_chars = integer("n_chars", c["n_chars"], 1)
    temperature = number("temperature", c["temperature"], 0.0)
    prompt = c["prompt"]
    if not isinstance(prompt, str) or not prompt:
        raise SpecsweepError(f"prompt must not be empty, got {prompt!r}")
    device = text("device", c["device"])
    if device != "cpu" and not device.startswith("cuda"):
        raise SpecsweepError(f"device must be cpu or cuda[:N], got {device!r}")
    target = target_spec(config)
    engine = engine_spec(c.sub("engine").node)
    devices = can.engine(engine.name).devices
    if device.split(":")[0] not in devices:
        where = "the CPU" if devices == ("cpu",) else f"device={' or '.join(devices)}"
        raise SpecsweepError(f"engine={engine.name} runs on {where}: use device=cpu, or engine="
                             f"{can.or_list(can.engines_where(lambda e: 'cuda' in e.devices and e.loop == can.TOOL))} "
                             f"on {device}")
    if device != "cpu":
        import torch
        if not torch.cuda.is_available():
            raise SpecsweepError(f"device={device}: this torch sees no CUDA device (a CPU build, or no GPU); "
                                 "use device=cpu")
    workload = workload_spec(c.sub("workload").node, prompt, n_chars, repo_path)
    need = None   # a model from a folder counts tokens: src/trial/checks.py, with its tokenizer
    if not is_folder_model(target.model):
        need = workload.longest + k
        check_window(workload, k, target.model["block_size"])
    draft = draft_spec(c.sub("draft").node, config)
    check_draft(draft, target, k, need)
    batch = batch_settings(c, tree, engine, draft, workload)
    check_folder_target(target, draft, engine, tree, batch)
    policy = policy_spec(c.sub("policy").node, tree, batch)
    check_engine(engine, draft, tree, policy)
    e = _Reader(config).sub("exactness")
    samples = integer("exactness.samples", e["samples"], 1)
    if boolean("exactness.enabled", e["enabled"]) and draft_facts(draft).library_only:
        raise SpecsweepError(f"exactness.enabled: draft {draft.name!r} has no distribution of its own to check; "
                             "tests/engine/huggingface/test_library_loop.py checks the library's sampler")
    return TrialSpec(target=target, draft=draft, k=k, tree=tree, seed=integer("seed", c["seed"], 0), n_chars=n_chars,
                     temperature=temperature, prompt=prompt, threads=integer("threads", c["threads"], 1),
                     device=device, timing=timing_spec(c.sub("timing").node), engine=engine,
                     exactness_samples=samples if boolean("exactness.enabled", e["enabled"]) else None,
                     batch=batch, policy=policy, workload=workload)


def check_window(workload: WorkloadSpec, k: int, window: int, unit: str = "chars", lengths=None,
                 whose: str = "the model's") -> None:
    """Every prompt + its n_chars + k must fit `whose` context window (lengths: the prompts'
    lengths in the model's tokens, where they are not their chars); refused in one sentence that
    names the longest prompt."""
    from .workload import Prompt
    if workload.prompts is None:   # drawn from the corpus: its sizes are the config's
        o = workload.options
        size = workload.longest - o["n_chars"]
        what = (f"workload={workload.name}: prompt_chars ({size})" if workload.name == "validation" else
                f"workload=copy: passage_chars + 2 + restart_chars ({size})")
        need = size + o["n_chars"] + k
        if need > window:
            raise SpecsweepError(f"{what} + n_chars ({o['n_chars']}) + k ({k}) = {need} {unit} exceeds {whose} "
                                 f"context window of {window}: lower workload.n_chars or the prompts' size")
        return
    lengths = lengths or [len(p.text) for p in workload.prompts]
    need, i = max((n + p.n_chars + k, i) for i, (n, p) in enumerate(zip(lengths, workload.prompts)))
    if need <= window:
        return
    p: Prompt = workload.prompts[i]
    tokens = " tokens" if unit == "tokens" else ""
    name = "prompt" if p.where == "the prompt" else f"the longest prompt ({p.where})"
    raise SpecsweepError(f"{name} ({lengths[i]} {unit}) + n_chars ({p.n_chars}{tokens}) + k ({k}) = {need} {unit} "
                         f"exceeds {whose} context window of {window}{tokens}: "
                         + ("use a shorter prompt, fewer n_chars or a smaller k" if p.where == "the prompt" else
                            "shorten it, lower its n_chars, or use a model with a longer window"))


def check_engine(engine: EngineSpec, draft: DraftSpec, tree, policy: "PolicySpec") -> None:
    """What an engine runs, by the capability table (src/trial/capabilities.py): the drafts that run
    on it (transformers' generate: a draft with a counterpart there, an assistant model or prompt
    lookup; a draft of the library's loop only runs nowhere else), a tree only where it verifies
    trees, and its policies. Each refused in one line."""
    facts, e = draft_facts(draft), can.engine(engine.name)
    if not facts.runs_on(e):
        if facts.library_only:
            raise SpecsweepError(f"draft {draft.name!r} runs in transformers' loop only: use engine="
                                 f"{can.or_list(facts.engines())} (the tool's own n-gram draft is draft=ngram)")
        if e.loop == can.LIBRARY:
            there = [d.name for d in can.conf_drafts() if d.runs_on(e) and not d.from_folder]
            raise SpecsweepError(f"draft {draft.name!r} has no counterpart in transformers' generate: use "
                                 f"draft={can.or_list(there)} with engine={engine.name}")
        return   # a draft model from a folder off the folder engines: check_folder_target says it
    if tree is not None and not e.trees:
        raise SpecsweepError(f"engine={engine.name} verifies chains only: use verify=chain")
    if policy.name not in e.policies:
        raise SpecsweepError(f"policy={policy.name} has no counterpart in transformers' generate: use "
                             f"{', '.join(e.policies)} with engine={engine.name}")
    if policy.name not in facts.policies(e):
        raise SpecsweepError(f"policy={policy.name}: prompt lookup drafts up to k tokens by its own rule; use "
                             f"policy={can.or_list(list(facts.policies(e)))}")


POLICY_OPTIONS = {"fixed": (), "heuristic": ("start",), "confidence": ("threshold",),
                  "cost": ("bins", "calibration_seqs", "calibration_chars", "calibration_seed", "profile_rounds")}


def policy_spec(node, tree, batch: int) -> PolicySpec:
    """The draft-length policy of conf/policy/, its options checked; an adaptive policy drafts a
    chain of one sequence (refused with a tree or a batch in one line)."""
    from ..engine.decoding.policy import ConfidencePolicy, HeuristicPolicy
    p = _Reader(node, "policy.")
    name = p["name"]
    if name not in POLICY_OPTIONS:
        raise SpecsweepError(f"unknown policy {name!r} (available: {', '.join(POLICY_OPTIONS)})")
    options = {key: plain(p[key]) for key in POLICY_OPTIONS[name]}
    extra = sorted(set(node) - set(POLICY_OPTIONS[name]) - {"name"})
    if extra:
        raise SpecsweepError(f"policy {name} has unknown keys: {', '.join(extra)}")
    try:
        if name == "heuristic" and options["start"] is not None:
            HeuristicPolicy(options["start"])
        if name == "confidence":
            ConfidencePolicy(options["threshold"])
    except ValueError as e:
        raise SpecsweepError(str(e)) from None
    if name == "cost":
        for key in ("bins", "calibration_seqs", "calibration_chars", "profile_rounds"):
            integer(f"policy.{key}", options[key], 1)
        integer("policy.calibration_seed", options["calibration_seed"], 0)
    if tree is not None and not can.policy(name).trees:
        raise SpecsweepError(f"policy={name} drafts chains: use verify=chain (a tree's shape is fixed)")
    if batch > 1 and not can.policy(name).batch:
        raise SpecsweepError(f"policy={name} drafts one sequence: use batch=1 (a batch drafts k chars a pass)")
    return PolicySpec(name, options)


def batch_settings(c: _Reader, tree, engine: EngineSpec, draft: DraftSpec, workload: WorkloadSpec) -> int:
    """The batch size, refused in one line where a batch cannot run: a tree, an engine or a draft
    that runs one sequence (the capability table, src/trial/capabilities.py), or a workload whose
    prompts generate different lengths (a batch's rows generate n_chars each)."""
    batch = integer("batch", c["batch"], 1)
    if batch == 1:
        return batch
    if not can.verify("chain" if tree is None else "tree").batch:
        raise SpecsweepError(f"batch={batch} decodes chains only: use verify=chain (or batch=1 for a tree)")
    if not can.engine(engine.name).batch:
        raise SpecsweepError(f"batch={batch}: engine={engine.name} runs one sequence; use engine="
                             f"{can.or_list(can.engines_where(lambda e: e.batch))}")
    if not draft_facts(draft).batch():
        raise SpecsweepError(f"batch={batch}: draft {draft.name!r} drafts one sequence at a time; use batch=1")
    if workload.prompts is not None and len({p.n_chars for p in workload.prompts}) > 1:
        raise SpecsweepError(f"batch={batch}: the workload's prompts ask for different lengths (n_chars), and a "
                             "batch's rows generate one length: give every prompt one n_chars, or use batch=1")
    if workload.prompts is not None and len({len(p.text) for p in workload.prompts}) > 1:
        raise SpecsweepError(f"batch={batch}: the workload's prompts have different lengths, and a batch here starts "
                             "its rows in lockstep from prompts of one length: use batch=1 for this workload")
    return batch


def check_draft(draft: DraftSpec, target: TargetSpec, k: int, need: int | None) -> None:
    """What a draft's own settings allow: heads draft at most one char per head; a model draft
    must fit the trial's chars (`need`; None for a target from a folder, whose tokens
    src/trial/checks.py counts) in its own context window and must not be the target itself: the
    same model config, corpus, training and train_seed give the same cache key, hence the same
    checkpoint, and a target drafting for itself accepts every char by construction (p = q)
    while paying a full forward per drafted char: it measures only the loop's overhead, so it is
    refused rather than swept."""
    n_heads = draft.options.get("n_heads")
    if isinstance(n_heads, int) and k > n_heads:
        raise SpecsweepError(f"k = {k} exceeds the {n_heads} heads of draft {draft.name!r} (set draft.n_heads >= k)")
    if draft.model is None:
        return
    if need is not None and draft.model.model["block_size"] < need:
        raise SpecsweepError(f"draft {draft.name!r}: its model's context window ({draft.model.model['block_size']}) "
                             f"is shorter than prompt + n_chars + k = {need}: use a shorter prompt, fewer n_chars or a "
                             "smaller k")
    if draft.model.model == target.model:
        raise SpecsweepError(f"draft {draft.name!r} has the target's own model config: it would be the target drafting "
                             "for itself (acceptance 1 by construction); use a larger target (model=medium) "
                             "or another draft model (model@draft.model=NAME)")
