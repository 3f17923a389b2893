"""Workloads (src/trial/workload.py, src/trial/per_category.py): the files read as the field
writes them, the built-in sets drawn the same everywhere, a trial over a workload pooling exactly
the counters of its prompts' own trials, the categories adding up, the timing's rounds, and the
interval over prompts covering what a new set of prompts would give."""
from __future__ import annotations

import json

import numpy as np
import pytest

from src.engine.decoding.batch import generate_speculative_batch, stream_generators
from src.engine.models.corpus import synthetic_text
from src.engine.errors import SpecsweepError
from src.engine.measuring.timing import paired_timing, paired_workload_timing
from src.trial.per_category import prompt_bootstrap, total_time_speedup
from src.trial.load import build_draft
from src.trial.render import trial_block
from src.trial.spec import trial_spec
from src.trial.trial import run_trial
from src.trial.workload import copy_prompts, digest, layout_category, validation_prompts, workload_spec
from tests.conftest import PROMPT, compose_cfg


def write_lines(path, *rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_the_files_are_read_as_the_field_writes_them(tmp_path):
    """Our own lines, Spec-Bench's and MT-Bench's question lines (first turn), a line without a
    category, a line with its own length, blank lines skipped, unknown keys ignored."""
    path = write_lines(tmp_path / "p.jsonl",
                       {"prompt": "the cat ", "category": "story", "n_chars": 7},
                       "",
                       {"question_id": 81, "category": "writing", "turns": ["Compose a blog post.", "Rewrite it."]},
                       {"question_id": 1, "category": "summarization", "turns": ["Summarize: ..."], "reference": ["x"]},
                       {"prompt": "no category here"})
    w = workload_spec({"name": "file", "path": path, "n_chars": None}, "ignored", 30)
    assert [(p.text, p.category, p.n_chars) for p in w.prompts] == [
        ("the cat ", "story", 7), ("Compose a blog post.", "writing", 30), ("Summarize: ...", "summarization", 30),
        ("no category here", "uncategorized", 30)]
    assert [p.where for p in w.prompts] == ["line 1 of p.jsonl", "line 3 of p.jsonl", "line 4 of p.jsonl",
                                            "line 5 of p.jsonl"]
    # workload.n_chars is the default length of a line that gives none
    w = workload_spec({"name": "file", "path": path, "n_chars": 12}, "ignored", 30)
    assert [p.n_chars for p in w.prompts] == [7, 12, 12, 12]


@pytest.mark.parametrize("rows,message", [
    (["", "  "], "holds no prompts"),
    (['{"prompt": "a"}', '{"prompt": "b"'], "line 2 of p.jsonl is not JSON"),
    (['["a", "b"]'], "line 1 of p.jsonl is not a JSON object"),
    (['{"question_id": 3, "category": "qa"}'], 'line 1 of p.jsonl has neither "prompt" nor "turns"'),
    (['{"prompt": ""}'], "has a prompt that is not a non-empty string"),
    (['{"prompt": 5}'], "has a prompt that is not a non-empty string"),
    (['{"turns": []}'], "has `turns` that is not a non-empty list"),
    (['{"turns": [7]}'], "has a prompt that is not a non-empty string"),
    (['{"prompt": "a", "category": 3}'], "has a category that is not a non-empty string"),
    (['{"prompt": "a", "n_chars": 0}'], "has n_chars 0"),
    (['{"prompt": "a", "n_chars": "5"}'], "has n_chars '5'"),
    (['{"prompt": "a", "n_chars": true}'], "has n_chars True"),
    (['{"prompt": "a", "category": "math reasoning"}', '{"prompt": "b", "category": "math_reasoning"}'],
     "would log the same metrics"),
    (['{"prompt": "a", "category": "overall"}'], "a category is named 'overall'"),
])
def test_a_bad_file_is_refused_in_one_sentence_naming_the_line(tmp_path, rows, message):
    path = write_lines(tmp_path / "p.jsonl", *rows)
    with pytest.raises(SpecsweepError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        workload_spec({"name": "file", "path": path, "n_chars": None}, "x", 10)


def test_unreadable_files_and_bad_options_are_refused(tmp_path):
    (tmp_path / "latin1.jsonl").write_bytes('{"prompt": "caf\xe9"}\n'.encode("latin-1"))
    cases = [({"name": "file", "path": str(tmp_path / "latin1.jsonl"), "n_chars": None}, "is not UTF-8 text"),
             ({"name": "file", "path": str(tmp_path), "n_chars": None}, "is not a regular file"),
             ({"name": "file", "path": str(tmp_path / "none.jsonl"), "n_chars": None}, "no such file"),
             ({"name": "file", "path": None, "n_chars": None}, "needs workload.path=FILE"),
             ({"name": "file", "path": "x", "n_chars": 0}, "workload.n_chars must be an integer >= 1"),
             ({"name": "validation", "per_category": 0, "prompt_chars": 8, "n_chars": 8, "seed": 0},
              "workload.per_category must be an integer >= 1"),
             ({"name": "copy", "prompts": 2, "passage_chars": 8, "restart_chars": 8, "n_chars": 8, "seed": 0},
              "restart_chars \\(8\\) must be below"),
             ({"name": "validation", "per_category": 1, "prompt_chars": 8, "n_chars": 8}, "lacks workload.seed"),
             ({"name": "single", "nosuch": 1}, "unknown keys: nosuch"),
             ({"name": "nosuch"}, "unknown workload 'nosuch'")]
    for node, message in cases:
        with pytest.raises(SpecsweepError, match=message):
            workload_spec(node, "x", 10)


@pytest.mark.parametrize("lines,category", [
    (["[Enter HAMLET.]", "To be, or not to be"], "stage"),
    (["ACT III.", "SCENE 1. A room"], "stage"),
    (["Hold.", "Exeunt."], "stage"),
    (["PANDARUS.", "Where?", "", "BOY.", "At your own house."], "dialogue"),
    (["chiefest of them too. If I cannot ward what I would not have hit,", "I can watch you for telling",
      "past hiding, and then it's past watching"], "prose"),
    (["What grief hath set these jaundies o'er your cheeks?", "The ample proposition that hope makes",
      "In all designs begun on earth below"], "verse"),
    (["NESTOR.", "With due observance of thy godlike seat,", "Great Agamemnon, Nestor shall apply"], "verse"),
    (["lower case on the first line only", "And capitals after"], "verse"),
])
def test_the_layout_categories(lines, category):
    assert layout_category(lines) == category


LAYOUT_TEXT = "\n\n".join(
    ["[Enter KING and LORDS.]", "KING.\nWhat news?\n\nLORD.\nNone, my liege.\n\nKING.\nThen go.",
     "CLOWN.\nI am a very fool, sir, and I know it not; for there is\nno man so wise as to know how\nlittle he knows of it.",
     "QUEEN.\nThe ample proposition that hope makes\nIn all designs begun on earth below\nFails in the promis'd largeness"]
) + "\n\n"


def test_validation_windows_are_drawn_per_category_without_overlap():
    """On a text with every layout, per_category windows of each category, none overlapping, each
    the split's text at its offset, starting a non-blank line, its category that of the text after it."""
    val = LAYOUT_TEXT * 40
    prompts = validation_prompts(val, 3, 20, 30, seed=5)
    assert [p.category for p in prompts] == ["verse"] * 3 + ["prose"] * 3 + ["dialogue"] * 3 + ["stage"] * 3
    spans = sorted((p.offset, p.offset + 50) for p in prompts)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))                     # no two overlap
    for p in prompts:
        s = p.offset
        assert p.text == val[s:s + 20] and p.n_chars == 30 and (s == 0 or val[s - 1] == "\n") and val[s] != "\n"
        assert layout_category(val[val.rfind("\n", 0, s + 20) + 1:val.find("\n", s + 50)].split("\n")) == p.category


def test_the_built_in_workloads_are_the_same_on_every_machine():
    """Drawn with Python's own random.Random: the digests of the default settings on the synthetic
    text are fixed (a change of the drawing, or a platform's generator, changes them)."""
    val = synthetic_text(60_000)[54_000:]
    v = validation_prompts(val, 4, 32, 24, seed=0)
    c = copy_prompts(val, 8, 40, 8, 24, seed=0)
    assert (len(v), len(c)) == (4, 8)           # the synthetic text's lines are all verse by the layout rule
    assert digest(v) == "49e5deaa6c0a7443"
    assert digest(c) == "69964cde1cd7b645"
    assert digest(validation_prompts(val, 4, 32, 24, seed=1)) != digest(v)
    assert all(p.text.endswith("\n\n" + p.text[:8]) and len(p.text) == 50 for p in c)   # shown, then restarted


def test_a_split_without_room_for_a_window_is_refused():
    with pytest.raises(SpecsweepError, match="shorter than one workload window"):
        validation_prompts("the cat sat\n" * 3, 1, 30, 30, seed=0)


def spec_of(cfg, *overrides):
    return trial_spec(compose_cfg(cfg.data.path, cfg.data.cache_dir, "timing.lock=false", *overrides))


COUNTERS = ["acceptance", "position_acceptance", "analytic_acceptance", "chars_per_pass", "target_passes",
            "baseline_passes", "draft_calls", "proposed", "accepted", "acceptance_pos_1", "acceptance_pos_2"]


def test_one_prompt_is_the_plain_trial(tiny, tmp_path):
    """A file of the config's own prompt gives exactly the single workload's counters and text."""
    cfg, corpus, target = tiny
    path = write_lines(tmp_path / "one.jsonl", {"prompt": PROMPT, "category": "c"})
    plain = run_trial(spec_of(cfg, "draft=bigram", "k=2"), progress=False, loaded=(corpus, target))
    one = run_trial(spec_of(cfg, "draft=bigram", "k=2", "workload=file", f"workload.path={path}"), progress=False,
                    loaded=(corpus, target))
    assert {k: one.metrics[k] for k in COUNTERS} == {k: plain.metrics[k] for k in COUNTERS}
    assert one.text == plain.text and one.metrics["prompts"] == 1 and one.metrics["target_passes.c"] == \
        plain.metrics["target_passes"]


def test_a_workload_pools_its_prompts_own_trials_and_its_categories_add_up(tiny, tmp_path):
    """Three prompts in two categories, of other lengths: every prompt's counters equal a single
    trial of that prompt alone; the categories' counts add up to the workload's; the rounds time
    every prompt, a round's total being its prompts' runs added up."""
    cfg, corpus, target = tiny
    rows = [{"prompt": "the cat ", "category": "a", "n_chars": 40}, {"prompt": "The dog ran", "category": "b"},
            {"prompt": "a big red hat ", "category": "a", "n_chars": 20}]
    path = write_lines(tmp_path / "three.jsonl", *rows)
    r = run_trial(spec_of(cfg, "draft=bigram", "k=2", "workload=file", f"workload.path={path}", "timing.pairs=3"),
                  progress=False, loaded=(corpus, target))
    m = r.metrics
    alone = [run_trial(spec_of(cfg, "draft=bigram", "k=2", f"prompt='{row['prompt']}'", f"n_chars={row.get('n_chars', 64)}"),
                       progress=False, loaded=(corpus, target)).metrics for row in rows]
    assert [p["target_passes"] for p in r.prompts] == [a["target_passes"] for a in alone]
    assert [p["accepted"] for p in r.prompts] == [a["accepted"] for a in alone]
    assert m["target_passes"] == sum(a["target_passes"] for a in alone) == m["target_passes.a"] + m["target_passes.b"]
    assert m["baseline_passes"] == 40 + 64 + 20 and (m["prompts.a"], m["prompts.b"], m["categories"]) == (2, 1, 2)
    for i in (1, 2):   # per position: the passes that kept draft i, over all passes, pooled
        kept = sum(a[f"acceptance_pos_{i}"] * a["target_passes"] for a in alone)
        assert m[f"acceptance_pos_{i}"] * m["target_passes"] == pytest.approx(kept)
    assert m["chars_per_pass.a"] == pytest.approx((alone[0]["chars_per_pass"] * alone[0]["target_passes"] +
                                                   alone[2]["chars_per_pass"] * alone[2]["target_passes"]) /
                                                  (alone[0]["target_passes"] + alone[2]["target_passes"]))
    t = r.timing
    assert len(t.prompt_baseline_s) == 3 and all(len(x) == m["pairs_used"] == 3 for x in t.prompt_baseline_s)
    assert t.baseline_s == pytest.approx([sum(x[i] for x in t.prompt_baseline_s) for i in range(3)])
    assert m["speedup.b"] == pytest.approx(np.median(t.prompt_baseline_s[1]) / np.median(t.prompt_speculative_s[1]))
    assert m["speedup_lo.a"] <= m["speedup.a"] <= m["speedup_hi.a"]
    block = trial_block(spec_of(cfg, "draft=bigram", "k=2", "workload=file", f"workload.path={path}"), r)
    assert "workload=file (3 prompts, 2 categories, n_chars=20-64)" in block and "over prompts" in block


def test_the_rounds_alternate_per_prompt():
    """Warm-ups of every prompt first; in round r prompt i runs B,S when r + i is even, else S,B;
    a round's times are its prompts' added up; one prompt is plain paired timing."""
    calls = []
    ticks = iter(range(10_000))

    def arm(name):
        return lambda: calls.append(name)
    t = paired_workload_timing([arm("B0"), arm("B1")], [arm("S0"), arm("S1")], 2,
                               clock=lambda: float(next(ticks)), cpu_clock=lambda: 0.0)
    assert calls == ["B0", "S0", "B1", "S1",                       # warm-ups
                     "B0", "S0", "S1", "B1",                       # round 0: prompt 0 B,S; prompt 1 S,B
                     "S0", "B0", "B1", "S1"]                       # round 1: flipped
    assert t.order == ["BS", "SB"] and t.prompt_baseline_s == [[1.0, 1.0], [1.0, 1.0]] and t.baseline_s == [2.0, 2.0]
    calls.clear()
    single = paired_timing(arm("B"), arm("S"), 3, clock=lambda: float(next(ticks)), cpu_clock=lambda: 0.0)
    assert calls == ["B", "S", "B", "S", "S", "B", "B", "S"] and single.order == ["BS", "SB", "BS"]


def population(rng, n):
    """n prompts: baseline seconds and a speedup of their own (log-normal spread), 6 noisy rounds each."""
    base = rng.lognormal(0.0, 0.3, n)
    speed = rng.lognormal(np.log(1.6), 0.25, n)
    noise_b = rng.lognormal(0.0, 0.03, (n, 6))
    noise_s = rng.lognormal(0.0, 0.03, (n, 6))
    return base[:, None] * noise_b, (base / speed)[:, None] * noise_s


def test_the_interval_over_prompts_covers_a_new_set_of_prompts():
    """The population's total-time speedup (from 200,000 prompts) against 200 workloads of 16
    prompts: the prompt-then-rounds bootstrap's 95% interval (widened for 16 prompts) covers it 186
    times here; the test asks 176 (88%: 2.8 sigma below 93% for 200 workloads), while an interval
    from the rounds alone (no prompt drawn: the negative control, what one prompt's timing interval
    says) covers it in at most half of them (37 here)."""
    rng = np.random.default_rng(1)
    big_b, big_s = population(rng, 200_000)
    truth = big_b.mean(axis=1).sum() / big_s.mean(axis=1).sum()
    covered = rounds_only = 0
    for trial in range(200):
        b, s = population(rng, 16)
        lo, hi = prompt_bootstrap(b, s, [0] * 16, 0.95, reps=400, seed=trial)
        covered += lo <= truth <= hi
        per_round = b.sum(axis=0) / s.sum(axis=0)    # a round's total ratio: the rounds alone
        lo2, hi2 = np.quantile(per_round, [0.025, 0.975])
        rounds_only += lo2 <= truth <= hi2
    assert covered >= 176, covered
    assert rounds_only <= 100, rounds_only
    assert total_time_speedup(b, s) == pytest.approx(np.median(b, axis=1).sum() / np.median(s, axis=1).sum())


def test_strata_keep_each_categorys_prompts():
    """Prompts drawn within their category: a workload of two categories far apart never mixes
    them, so its replicates stay near the fixed category mix (a draw across categories would
    spread them)."""
    b = np.ones((8, 3))
    s = np.concatenate([np.full((4, 3), 0.5), np.full((4, 3), 1.0)])   # category 0: 2x; category 1: 1x
    lo, hi = prompt_bootstrap(b, s, [0] * 4 + [1] * 4, 0.95, reps=500)
    assert lo == hi == pytest.approx(8 / 6)          # every replicate has 4 of each
    lo, hi = prompt_bootstrap(b, s, [0] * 8, 0.95, reps=500)
    assert lo < 8 / 6 < hi                           # drawn across: the mix moves


def draft_of(spec, target, corpus):
    return build_draft(spec.draft, spec.target, target, corpus, None)


def test_a_batch_runs_the_workload_as_its_rows(tiny, tmp_path):
    """Three prompts of one length at B = 2: two batches, rows [0, 1] and [2, 0]; each prompt's
    counters are its rows' pooled; sequence numbers (streams) go on counting across batches."""
    cfg, corpus, target = tiny
    path = write_lines(tmp_path / "b.jsonl", {"prompt": "the cat ", "category": "a"},
                       {"prompt": "The dog ", "category": "b"}, {"prompt": "a big ha", "category": "a"})
    spec = spec_of(cfg, "draft=bigram", "k=2", "batch=2", "workload=file", f"workload.path={path}", "n_chars=24")
    r = run_trial(spec, progress=False, loaded=(corpus, target))
    assert [(s["batch"], s["prompt_index"], s["seq"]) for s in r.sequences] == [(0, 0, 0), (0, 1, 1), (1, 2, 2), (1, 0, 3)]
    by_prompt = {i: sum(s["passes"] for s in r.sequences if s["prompt_index"] == i) for i in range(3)}
    assert [p["target_passes"] for p in r.prompts] == [by_prompt[0], by_prompt[1], by_prompt[2]]
    assert r.metrics["baseline_passes"] == 2 * 24 and len(r.timing.prompt_baseline_s) == 2
    # the second batch is rows 2 and 3 of the workload: their own streams, as a batch run of its own gives
    ids = [target.tokenizer.encode(t).tolist() for t in ("a big ha", "the cat ")]
    second = generate_speculative_batch(target.model, draft_of(spec, target, corpus), ids, 24, 2, 1.0,
                                        stream_generators(0, 2, first=2))
    assert [s["passes"] for s in r.sequences[2:]] == second.passes
    assert "speedup.a" not in r.metrics and r.metrics["prompts.a"] == 2   # a batch mixes categories: no speedup each


@pytest.mark.parametrize("shape", [["verify=tree", "verify.widths=[2,1]", "k=2"], ["policy=heuristic", "k=4"]])
def test_trees_and_policies_run_a_workload_prompt_by_prompt(tiny, tmp_path, shape):
    """A tree and an adaptive policy over two prompts: each prompt's counters are its own trial's."""
    cfg, corpus, target = tiny
    rows = [{"prompt": "the cat ", "category": "a", "n_chars": 30}, {"prompt": "The dog ran ", "category": "b"}]
    path = write_lines(tmp_path / "two.jsonl", *rows)
    r = run_trial(spec_of(cfg, "draft=bigram", *shape, "workload=file", f"workload.path={path}"), progress=False,
                  loaded=(corpus, target))
    alone = [run_trial(spec_of(cfg, "draft=bigram", *shape, f"prompt='{row['prompt']}'",
                               f"n_chars={row.get('n_chars', 64)}"), progress=False, loaded=(corpus, target)).metrics
             for row in rows]
    assert [(p["target_passes"], p["proposed"], p["accepted"]) for p in r.prompts] == \
        [(a["target_passes"], a["proposed"], a["accepted"]) for a in alone]
    assert r.metrics["proposed"] == sum(a["proposed"] for a in alone)
