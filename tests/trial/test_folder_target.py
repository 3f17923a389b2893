"""model=hf model.path=DIR: a trial on a model from a folder. The tool's target exported with
`python -m src.export` reproduces the built-in model's trial counters for the same seed, and
what the adapter cannot run, or a folder that is not a checkpoint, is refused in one line
before any work."""
from __future__ import annotations

import re
import sys

import pytest
import torch

from src.engine.errors import SpecsweepError
from src.engine.huggingface.folder_model import load_checkpoint
from src.export import main as export_main
from src.trial.spec import trial_spec
from src.trial.trial import run_trial
from tests.conftest import REPO, compose_cfg
from tests.commands import run_command

COUNTERS = ["acceptance", "position_acceptance", "chars_per_pass", "target_passes", "draft_calls", "proposed",
            "accepted", "acceptance_pos_1", "acceptance_pos_2"]   # counts and their ratios: exactly equal
# sum_x min(p, q) over the tested positions, from probabilities whose logits agree to ~1e-7 (GPT-2's
# kernels add in another order): equal to float precision
ANALYTIC = "analytic_acceptance"


@pytest.fixture(scope="module")
def export_dir(tiny, tmp_path_factory):
    cfg, _, target = tiny
    folder = tmp_path_factory.mktemp("exports") / "tiny"
    assert export_main([str(folder), "model=tiny", "train=quick", f"data.path={cfg.data.path}",
                        f"data.cache_dir={cfg.data.cache_dir}"]) == 0
    return folder


def folder_cfg(tiny, folder, *overrides):
    cfg, _, _ = tiny
    return compose_cfg(cfg.data.path, cfg.data.cache_dir, "model=hf", f"model.path={folder}", *overrides)


@pytest.mark.parametrize("draft,k,verify", [("bigram", 2, []), ("ngram", 4, []),
                                            ("bigram", 2, ["verify=tree", "verify.widths=[3,1]"])])
def test_an_exported_target_gives_the_built_in_models_counters(tiny, export_dir, draft, k, verify):
    cfg, _, target = tiny
    built_in = run_trial(trial_spec(compose_cfg(cfg.data.path, cfg.data.cache_dir, f"draft={draft}", f"k={k}",
                                                *verify)), progress=False)
    spec = trial_spec(folder_cfg(tiny, export_dir, f"draft={draft}", f"k={k}", *verify))
    folder = run_trial(spec, progress=False)
    assert {c: folder.metrics[c] for c in COUNTERS} == {c: built_in.metrics[c] for c in COUNTERS}
    assert folder.metrics[ANALYTIC] == pytest.approx(built_in.metrics[ANALYTIC], rel=1e-6)
    assert folder.text == built_in.text
    # GPT-2 has biases (zero in the export) where the tool's model has none: its own count
    assert folder.info["target_key"].startswith("hf-") and folder.info["target_params"] == \
        load_checkpoint(export_dir)[0].n_params() > target.model.n_params()


@pytest.mark.parametrize("overrides,message", [
    (["engine=onnx"], "model=hf runs on engine=eager, compiled or transformers here, not engine=onnx"),
    (["engine=compiled", "verify=tree", "verify.widths=[2,1]", "k=2"], "engine=compiled verifies chains"),
    (["engine=transformers", "draft=bigram"], "no counterpart in transformers' generate for model=hf"),
    (["engine=transformers", "draft=prompt_lookup", "verify=tree", "verify.widths=[2,1]", "k=2"],
     "engine=transformers verifies chains only"),
    (["draft=bigram", "batch=4"], "one sequence at a time"),
    (["draft=int8"], "reads the tool's own model"),
    (["model.max_len=1"], "model.max_len must be an integer >= 2"),
    (["+model.n_layer=2"], "model=hf has unknown keys: n_layer"),
])
def test_what_the_adapter_cannot_run_is_refused_by_the_spec(tiny, export_dir, overrides, message):
    with pytest.raises(SpecsweepError, match=re.escape(message)):
        trial_spec(folder_cfg(tiny, export_dir, *overrides))


def test_a_missing_path_or_a_folder_that_is_no_checkpoint_is_refused(tiny, tmp_path):
    cfg, _, _ = tiny
    with pytest.raises(SpecsweepError, match="needs model.path=DIR"):
        trial_spec(compose_cfg(cfg.data.path, cfg.data.cache_dir, "model=hf"))
    with pytest.raises(SpecsweepError, match="no config.json"):
        trial_spec(folder_cfg(tiny, tmp_path))


@pytest.mark.slow
def test_the_command_line_refuses_bad_folder_input_in_one_line_before_any_work(tiny, export_dir, tmp_path):
    cfg, _, _ = tiny
    store = tmp_path / "store"
    base = [sys.executable, "-m", "src.run", "model=hf", f"data.path={cfg.data.path}", f"data.cache_dir={tmp_path}/cache",
            f"tracking.uri=sqlite:///{store}/mlflow.db", f"hydra.run.dir={tmp_path}/run", "n_chars=32", "draft=bigram"]
    t5 = tmp_path / "t5"                                                    # not a causal LM
    t5.mkdir()
    (t5 / "config.json").write_text('{"model_type": "t5"}')
    (t5 / "model.safetensors").write_bytes(b"")
    (t5 / "tokenizer.json").write_text("{}")
    cases = [([f"model.path={tmp_path}/nosuch"], "does not exist"),
             ([f"model.path={t5}"], "'t5' is not a causal LM"),
             ([f"model.path={export_dir}", "prompt='the cat \u2603'"], "cannot encode")]
    cases += damaged_folders(tiny, export_dir, tmp_path)
    for extra, message in cases:
        flags = [a for a in extra if a == "-m"]                            # -m before the overrides
        proc = run_command(base[:3] + flags + base[3:] + [a for a in extra if a != "-m"], cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], \
            proc.stderr[-2000:]
        assert not store.exists() and not (tmp_path / "run").exists()       # nothing written, no Hydra folder


def damaged_folders(tiny, export_dir, tmp_path) -> list[tuple[list[str], str]]:
    """Copies of the export with a damaged weights file (truncated, alone and in a sweep; a header
    that is not JSON: safetensors raises its own SafetensorError), one whose tokenizer encodes the prompt but lacks a
    char of the corpus, and an encoder (BertForMaskedLM) as a draft's model: (overrides, message)."""
    import shutil
    from src.engine.huggingface.checkpoint import char_tokenizer
    from tests.engine.huggingface.test_folder_model import encoders
    _, corpus, target = tiny
    out = []
    for name, damage, message in (("truncated", lambda b: b[:len(b) // 2], "SafetensorError"),
                                  ("header", lambda b: b[:8] + b"\xff" * 16 + b[24:], "SafetensorError")):
        folder = tmp_path / name
        shutil.copytree(export_dir, folder)
        weights = folder / "model.safetensors"
        weights.write_bytes(damage(weights.read_bytes()))
        out.append(([f"model.path={folder}", "prompt='the cat '"], f"its weights cannot be loaded ({message}"))
    out.append((["-m", f"model.path={tmp_path / 'truncated'}", "prompt='the cat '", "k=1,2"],  # a sweep's parent too
                "its weights cannot be loaded (SafetensorError"))
    lacking = tmp_path / "lacking"
    shutil.copytree(export_dir, lacking)
    assert "!" in corpus.text and "!" not in "the cat "
    char_tokenizer([c for c in target.tokenizer.chars if c != "!"]).save_pretrained(lacking)
    out.append(([f"model.path={lacking}", "prompt='the cat '"], "tokenizer cannot encode it (1 char(s) it has no "
                                                                "token for: '!')"))
    bert = encoders(tmp_path, target.tokenizer.chars)["bert_mlm"]
    out.append((["model=tiny", "train=quick", "draft=hf_model", f"draft.model.path={bert}", "prompt='the cat '"],
                "saved as BertForMaskedLM, not a causal LM"))
    return out


def test_export_refuses_a_folder_in_use_and_a_model_from_a_folder(tiny, export_dir, capsys):
    for args, message in (([str(export_dir)], "is not an empty folder"),
                          ([str(export_dir.parent / "again"), "model=hf", f"model.path={export_dir}"],
                           "is a checkpoint already")):
        with pytest.raises(SystemExit) as e:
            export_main(args)
        assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
def test_a_sweep_over_a_tiny_llama_from_a_folder(tiny, tmp_path):
    """The smoke sweep of a model from a folder: a random-weight Llama made here, two drafts x two k
    on joblib workers; the parent publishes the folder's digest (nothing uploaded), each worker
    reads the folder, and every trial records its key."""
    from src.engine.huggingface.checkpoint import char_tokenizer, offline_transformers
    from tests.conftest import runs_of
    from tests.engine.huggingface.test_folder_model import tiny_config
    cfg, _, target = tiny
    folder = tmp_path / "llama"
    offline_transformers().AutoModelForCausalLM.from_config(tiny_config("llama", target.tokenizer.vocab_size)).save_pretrained(folder)
    char_tokenizer(target.tokenizer.chars).save_pretrained(folder)
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    proc = run_command([sys.executable, "-m", "src.run", "-m", "model=hf", f"model.path={folder}",
                           "draft=bigram,ngram", "k=1,2", "n_chars=24", "timing.pairs=1", "timing.cost_reps=2",
                           "timing.cost_width=null", f"data.path={cfg.data.path}", f"data.cache_dir={tmp_path}/cache",
                           "prompt='the cat '", f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path}/sweep"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, runs = runs_of(uri)
    trials = [r for r in runs if r.data.tags.get("specsweep.kind") == "trial"]
    targets = [r for r in runs if r.data.tags.get("specsweep.kind") == "target"]
    assert len(trials) == 4 and all(r.info.status == "FINISHED" for r in trials)
    assert len(targets) == 1 and targets[0].data.tags["model_path"] == str(folder)
    key = targets[0].data.tags["target_key"]
    assert key.startswith("hf-") and {r.data.tags["target_key"] for r in trials} == {key}
    assert not (tmp_path / "cache" / "models").exists()                    # nothing trained, nothing copied


def test_a_draft_model_from_a_folder_drafts_for_a_target_from_a_folder(tiny, export_dir, folder_draft_model):
    spec = trial_spec(folder_cfg(tiny, export_dir, "draft=hf_model", f"draft.model.path={folder_draft_model}", "k=2"))
    r = run_trial(spec, progress=False)
    assert r.info["target_key"].startswith("hf-") and 0 < r.metrics["acceptance"] < 1
    assert r.metrics["chars_per_pass"] == pytest.approx(1 + 2 * r.metrics["acceptance"])   # every pass: kept + 1


@pytest.fixture(scope="module")
def noisy_export(export_dir, tmp_path_factory):
    """The exported target with Gaussian noise (0.05) on every weight: a draft model from a folder
    that is kept often and not always."""
    from src.engine.huggingface.checkpoint import char_tokenizer
    model, tok = load_checkpoint(export_dir)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("noisy_export")
    model.hf.save_pretrained(folder)
    char_tokenizer(tok.chars).save_pretrained(folder)
    return folder


def test_the_library_loop_runs_a_model_from_a_folder_as_the_tools_loop_does(tiny, export_dir, noisy_export):
    """engine=transformers on model=hf: transformers' generate on the folder's own model, a draft
    model from a folder as its assistant. Greedy, it emits the tool's loop's text with as many
    target passes; sampled, its counters add up (every pass emits its kept drafts plus one)."""
    draft = ["draft=hf_model", f"draft.model.path={noisy_export}", "k=3", "timing.target_width=null"]
    runs = {engine: run_trial(trial_spec(folder_cfg(tiny, export_dir, *draft, f"engine={engine}", "temperature=0")),
                              progress=False) for engine in ("eager", "transformers")}
    lib, tool = runs["transformers"], runs["eager"]
    assert lib.info["engine"] == "transformers" and lib.text == tool.text
    assert lib.metrics["target_passes"] == tool.metrics["target_passes"] < lib.metrics["baseline_passes"]
    assert lib.metrics["library_baseline_passes"] == lib.metrics["baseline_passes"]
    for drafting in (draft, ["draft=prompt_lookup", "k=3", "timing.target_width=null", "prompt='the cat the cat the cat '"]):
        r = run_trial(trial_spec(folder_cfg(tiny, export_dir, *drafting, "engine=transformers")), progress=False)
        m = r.metrics
        assert m["target_passes"] + m["accepted"] == m["baseline_passes"] and m["proposed"] > 0


@pytest.mark.slow
def test_the_compiled_engine_gives_a_model_from_a_folder_the_eager_counters(tiny, export_dir, noisy_export):
    """engine=compiled on model=hf (a static cache, one graph per pass width) against
    engine=eager, sampled: the same counters and text with a draft model from a folder, whose
    model runs compiled too (no fallback to eager: the target's graphs and the draft's, 5 or more).
    One draft: a compiled trial spends most of its time compiling; the target's path does not depend on it."""
    draft = ["draft=hf_model", f"draft.model.path={noisy_export}", "k=2"]
    runs = {e: run_trial(trial_spec(folder_cfg(tiny, export_dir, *draft, f"engine={e}")), progress=False)
            for e in ("eager", "compiled")}
    eager, compiled = runs["eager"], runs["compiled"]
    assert {c: compiled.metrics[c] for c in COUNTERS} == {c: eager.metrics[c] for c in COUNTERS}
    assert compiled.text == eager.text and compiled.info["engine"] == "compiled"
    assert compiled.metrics["compiled_graphs"] >= 5
    assert not any(k.startswith("engine_fallback") for k in compiled.info), compiled.info


def test_a_tree_over_a_model_from_a_folder_with_model_drafts(tiny, export_dir, noisy_export):
    """verify=tree on model=hf with the drafts that run a model (a draft model from a folder, the
    target's int8-kernel copy): greedy, the tree emits the chain's text; sampled, the counters of
    a tree add up (every pass emits its accepted path plus one; the last pass may run past n_chars
    by up to the tree's depth, cut off)."""
    chain = ["draft=hf_model", f"draft.model.path={noisy_export}", "k=2", "temperature=0"]
    tree = ["verify=tree", "verify.widths=[2,1]"]
    texts = [run_trial(trial_spec(folder_cfg(tiny, export_dir, *chain, *extra)), progress=False).text
             for extra in ([], tree)]
    assert texts[0] == texts[1]
    r = run_trial(trial_spec(folder_cfg(tiny, export_dir, "draft=int8_kernels", "k=2", *tree)), progress=False)
    m = r.metrics
    assert r.info["verify"].startswith("tree") and m["accepted"] > 0
    assert 0 <= m["target_passes"] + m["accepted"] - m["baseline_passes"] <= 2


def test_a_draft_with_another_tokenizer_is_refused_in_one_line_before_any_work(tiny, export_dir, folder_draft_model,
                                                                              tmp_path):
    from src.engine.huggingface.checkpoint import char_tokenizer
    cfg, _, target = tiny
    other = tmp_path / "other_tokenizer"
    other.mkdir()
    for f in folder_draft_model.iterdir():
        if f.suffix in (".json", ".safetensors") and not f.name.startswith("tokenizer"):
            (other / f.name).write_bytes(f.read_bytes())
    char_tokenizer(list(reversed(target.tokenizer.chars))).save_pretrained(other)   # the same chars, other ids
    store = tmp_path / "store"
    for target_args in ([], ["model=hf", f"model.path={export_dir}"]):     # the tool's target, and one from a folder
        proc = run_command([sys.executable, "-m", "src.run", *target_args, "draft=hf_model",
                               f"draft.model.path={other}", "model=tiny" if not target_args else "k=2",
                               "train=quick", f"data.path={cfg.data.path}", f"data.cache_dir={cfg.data.cache_dir}",
                               f"tracking.uri=sqlite:///{store}/mlflow.db", f"hydra.run.dir={tmp_path}/run", "n_chars=32",
                               "prompt='the cat '"],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        first, last = target.tokenizer.chars[-1], target.tokenizer.chars[0]       # same size, another order: said
        said = (f"its tokenizer is not the target's (both have {len(target.tokenizer.chars)} tokens; id 0 is {first!r} "
                f"in the draft's and {last!r} in the target's)")
        assert proc.returncode == 2 and len(lines) == 1 and said in lines[0], proc.stderr[-2000:]
        assert not store.exists()


def test_the_context_window_of_a_model_from_a_folder_counts_tokens(tiny, export_dir, folder_draft_model):
    """model=hf: n_chars counts tokens, and so does the refusal (the spec, which counts chars, leaves it to
    the checks that hold the tokenizer), for the target's window and a draft model's from a folder."""
    from src.trial.checks import check_inputs
    for draft in (["draft=bigram"], ["draft=hf_model", f"draft.model.path={folder_draft_model}"]):
        spec = trial_spec(folder_cfg(tiny, export_dir, *draft, "n_chars=1000", "k=2"))
        with pytest.raises(SpecsweepError, match=re.escape(
                "prompt (8 tokens) + n_chars (1000 tokens) + k (2) = 1010 tokens exceeds the model's context window "
                "of 128 tokens: use a shorter prompt, fewer n_chars or a smaller k")):
            check_inputs(spec)


def test_a_vocabulary_above_max_vocab_is_refused_for_the_distilled_table_only(tiny, export_dir, folder_draft_model):
    """The distilled table's build holds the target's distribution after every training position;
    the bigram (sparse above DENSE_MAX tokens), the n-gram (the contexts and tokens met) and a model
    draft do not (a 50,257-token GPT-2 runs with them): data.max_vocab=10 refuses distilled only.
    An n-gram order whose context codes overflow an int64 at the vocabulary is refused too."""
    from src.trial.checks import check_inputs
    with pytest.raises(SpecsweepError, match="more than data.max_vocab = 10"):
        check_inputs(trial_spec(folder_cfg(tiny, export_dir, "draft=distilled", "data.max_vocab=10")))
    for draft in (["draft=bigram"], ["draft=ngram"], ["draft=hf_model", f"draft.model.path={folder_draft_model}"]):
        check_inputs(trial_spec(folder_cfg(tiny, export_dir, *draft, "data.max_vocab=10")))
    with pytest.raises(SpecsweepError, match="ngram order 11 is too long for a vocabulary of 38 tokens"):
        check_inputs(trial_spec(folder_cfg(tiny, export_dir, "draft=ngram", "draft.order=11")))


def test_a_workload_on_an_exported_target_gives_the_built_in_models_counters(tiny, export_dir):
    """A two-category workload of validation windows: on the exported checkpoint the same counters per
    prompt as on the built-in model (its char tokenizer: a token is a char)."""
    cfg, _, _ = tiny
    workload = ["workload=validation", "workload.per_category=2", "workload.prompt_chars=24", "workload.n_chars=20"]
    built_in = run_trial(trial_spec(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=bigram", "k=2", *workload)),
                         progress=False)
    folder = run_trial(trial_spec(folder_cfg(tiny, export_dir, "draft=bigram", "k=2", *workload)), progress=False)
    assert len(folder.prompts) == len(built_in.prompts) >= 2
    assert [(p["category"], p["target_passes"], p["accepted"]) for p in folder.prompts] == \
        [(p["category"], p["target_passes"], p["accepted"]) for p in built_in.prompts]


@pytest.fixture(scope="module")
def subword_folder(tiny, tmp_path_factory):
    """A random-weight Llama with a subword tokenizer (byte-level BPE of 400 tokens trained here on the corpus), a
    48-token window: a prompt's tokens are fewer than its chars."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from src.engine.huggingface.checkpoint import offline_transformers
    from tests.engine.huggingface.test_folder_model import tiny_config
    cfg, corpus, _ = tiny
    t = offline_transformers()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator([corpus.text[:20_000]], trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    folder = tmp_path_factory.mktemp("subword")
    wrapped = t.PreTrainedTokenizerFast(tokenizer_object=tok)
    wrapped.save_pretrained(folder)
    config = tiny_config("llama", len(wrapped))
    config.max_position_embeddings = 48
    t.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def test_a_workload_on_a_subword_model_counts_tokens(tiny, subword_folder, tmp_path):
    """model=hf counts a workload in tokens: a 60-char prompt that is fewer than 30 tokens runs in a
    48-token window (n_chars 12 tokens), each prompt generating its n_chars tokens; a prompt past the
    window in tokens is refused in one line that says tokens, before any work."""
    import json
    from src.trial.checks import check_inputs
    prompt = "the cat sat on the mat and the dog ran to the big red hats. "
    assert len(prompt) == 60
    fits = tmp_path / "fits.jsonl"
    fits.write_text(json.dumps({"prompt": prompt, "category": "a"}) + "\n"
                    + json.dumps({"prompt": "the dog ", "category": "b", "n_chars": 8}) + "\n")
    spec = trial_spec(folder_cfg(tiny, subword_folder, "draft=bigram", "k=2", "n_chars=12", "workload=file",
                                 f"workload.path={fits}"))
    r = run_trial(spec, progress=False)
    assert [p["n_chars"] for p in r.prompts] == [12, 8] and r.metrics["baseline_passes"] == 20
    assert r.metrics["target_passes"] == r.metrics["target_passes.a"] + r.metrics["target_passes.b"]
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": prompt * 3, "category": "a"}) + "\n")
    spec = trial_spec(folder_cfg(tiny, subword_folder, "draft=bigram", "k=2", "n_chars=12", "workload=file",
                                 f"workload.path={long}"))
    with pytest.raises(SpecsweepError, match=r"the longest prompt \(line 1 of long.jsonl\) \(\d+ tokens\) \+ "
                                             r"n_chars \(12 tokens\) \+ k \(2\) = \d+ tokens exceeds the model's "
                                             r"context window of 48 tokens"):
        check_inputs(spec)
