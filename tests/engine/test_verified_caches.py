"""Every cached artefact the tool reads back is verified (src/engine/atomic.py: seal / sealed): an
exported ONNX graph or a draft's table with bytes overwritten (a file that still parses) or
truncated is detected, deleted and rebuilt, never used; and the target never runs under an engine
that cannot run it. Each check has a negative control: with the checksum test disabled (`sealed`
reduced to "the file exists"), the same corrupted graph is used and the counters change, so the
assertions here do catch a cache read back unverified."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch

import src.engine.drafts.table as table_module
import src.engine.runtimes.onnx_engine as onnx_module
from src.engine.atomic import sealed, sidecar
from src.engine.decoding.decode import generate_speculative
from src.engine.drafts import NgramDraft
from src.engine.runtimes.engines import Engine
from src.engine.errors import SpecsweepError
from tests.conftest import draft_options

K, N = 3, 48


def overwrite(path: Path) -> None:
    """64 bytes in the middle of the file replaced: the file keeps its size (and an ONNX graph its framing)."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes((b + 97) % 256 for b in data[mid:mid + 64])
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def onnx_run(tiny, drafts, cache: Path):
    """(chars, passes) of a speculative run on the onnx engine with graphs kept in `cache`."""
    cfg, _, target = tiny
    runner = Engine("onnx", cache_dir=cache).wrap(target.model)
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    g = generate_speculative(runner, drafts["bigram"], prompt, N, K, 1.0, torch.Generator().manual_seed(0))
    return g.tokens, g.passes_log


@pytest.fixture
def onnx_cache(tiny, drafts, tmp_path):
    """A cache folder with the graphs of one run, and that run's (chars, passes)."""
    clean = onnx_run(tiny, drafts, tmp_path)
    graphs = sorted((tmp_path / "onnx").glob("*.onnx"))
    assert graphs and all(sealed(g) for g in graphs)
    return tmp_path, graphs, clean


@pytest.mark.parametrize("damage", [overwrite, truncate])
def test_a_damaged_onnx_graph_is_rebuilt_not_used(tiny, drafts, onnx_cache, damage, caplog):
    cache, graphs, clean = onnx_cache
    for g in graphs:
        damage(g)
    with caplog.at_level(logging.WARNING, logger="src.engine.runtimes.onnx_engine"):
        again = onnx_run(tiny, drafts, cache)
    assert again == clean
    assert sum("fails its checksum" in r.getMessage() for r in caplog.records) == len(graphs)
    assert all(sealed(g) for g in graphs)


def test_a_graph_without_its_checksum_is_rebuilt(tiny, drafts, onnx_cache):
    cache, graphs, clean = onnx_cache
    before = graphs[0].stat().st_mtime_ns
    sidecar(graphs[0]).unlink()
    assert onnx_run(tiny, drafts, cache) == clean
    assert sealed(graphs[0]) and graphs[0].stat().st_mtime_ns != before


def test_negative_control_an_unverified_cache_uses_the_damaged_graph(tiny, drafts, onnx_cache, monkeypatch):
    """With `sealed` reduced to "the file exists", the overwritten graphs are loaded and the counters
    change: the test above would fail on a cache read back unverified."""
    cache, graphs, clean = onnx_cache
    for g in graphs:
        overwrite(g)
    monkeypatch.setattr(onnx_module, "sealed", lambda path: Path(path).is_file())
    try:
        damaged = onnx_run(tiny, drafts, cache)
    except Exception:   # a graph damaged past loading fails instead: also not the clean run
        damaged = None
    assert damaged != clean


@pytest.mark.parametrize("damage", [overwrite, truncate])
def test_a_damaged_draft_table_is_rebuilt_not_used(tiny, tmp_path, damage, caplog):
    cfg, corpus, target = tiny
    train_ids = target.tokenizer.encode(corpus.text[:20_000])
    options = draft_options("ngram")

    def build():
        return NgramDraft(target.model, train_ids, cache_dir=tmp_path, target_key=target.key, **options)
    first = build()
    path = first.cache_file
    assert sealed(path) and not first.cached
    damage(path)
    with caplog.at_level(logging.WARNING, logger="src.engine.drafts.table"):
        second = build()
    assert not second.cached and any("fails its checksum" in r.getMessage() for r in caplog.records)
    assert all(torch.equal(first.table[key], second.table[key]) for key in first.table)
    assert sealed(path) and build().cached     # the rebuilt table is read back


def test_negative_control_an_unverified_table_is_read_back_damaged(tiny, tmp_path, monkeypatch):
    cfg, corpus, target = tiny
    train_ids = target.tokenizer.encode(corpus.text[:20_000])
    options = draft_options("ngram")
    first = NgramDraft(target.model, train_ids, cache_dir=tmp_path, target_key=target.key, **options)
    data = torch.load(first.cache_file, weights_only=True)
    data["vals"] = data["vals"] * 0.5                       # a damaged table that still loads
    torch.save(data, first.cache_file)
    monkeypatch.setattr(table_module, "sealed", lambda path: Path(path).is_file())
    second = NgramDraft(target.model, train_ids, cache_dir=tmp_path, target_key=target.key, **options)
    assert second.cached and not torch.equal(first.table["vals"], second.table["vals"])


def test_the_target_never_runs_eager_under_the_onnx_engines_name(tiny, drafts, tmp_path, monkeypatch):
    """A graph the exporter cannot write: the target's pass is refused in one sentence; a model
    draft's model runs eager, said in its fallback."""
    cfg, _, target = tiny

    def broken(*args, **kwargs):
        raise RuntimeError("the exporter cannot take this model")
    monkeypatch.setattr(onnx_module, "export", broken)
    engine = Engine("onnx", cache_dir=tmp_path)
    runner = engine.wrap(target.model)
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    with pytest.raises(SpecsweepError, match="engine=onnx cannot run the target"):
        generate_speculative(runner, drafts["bigram"], prompt, N, K, 1.0, torch.Generator().manual_seed(0))
    draft_runner = engine.wrap(target.model, "draft int8", strict=False)
    draft_runner.setup_cache(1)
    draft_runner(torch.tensor([prompt[:1]]), torch.arange(1))
    assert draft_runner.fallback and "cannot take" in draft_runner.fallback
    shutil.rmtree(tmp_path / "onnx", ignore_errors=True)


# --- Inductor's cache: its code is loaded unverified, so each shape's first pass is checked against eager ---

COMPILED_SCRIPT = r'''
import json, sys
from pathlib import Path
import torch
import src.engine.runtimes.engines as engines
from src.engine.errors import SpecsweepError
from src.engine.models.model import ModelConfig, Transformer

cache, strict, check = Path(sys.argv[1]), sys.argv[2] == "target", sys.argv[3] == "on"
if not check:   # the negative control: the agreement check disabled
    engines.AGREEMENT = float("inf")
torch.manual_seed(0)
model = Transformer(ModelConfig(vocab_size=20, block_size=32, n_layer=1, n_head=2, d_model=16, dropout=0.0)).eval()
runner = engines.CompiledModel(model, "target" if strict else "draft model", None, {}, cache, strict)
idx, pos = torch.tensor([[1, 2, 3]]), torch.arange(3)
with torch.no_grad():
    model.setup_cache(1)
    try:
        out = runner(idx, pos)
    except SpecsweepError as e:
        print(json.dumps({"refused": str(e)}))
        sys.exit()
    model.setup_cache(1)
    gap = engines.disagreement(out, model(idx, pos))
print(json.dumps({"gap": gap, "fallback": runner.fallback}))
'''


def compiled_run(cache: Path, role: str = "target", check: str = "on") -> dict:
    """COMPILED_SCRIPT in a process of its own (an engine's state and Inductor's in-memory caches
    start empty each time), through the tests' command helper (tests/commands.py)."""
    import json
    import os
    import sys

    from src.paths import REPO
    from tests.commands import run_command
    folder = cache.parent / "probe"
    folder.mkdir(exist_ok=True)
    (folder / "compiled_probe.py").write_text(COMPILED_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(folder)]))
    proc = run_command([sys.executable, "-m", "compiled_probe", str(cache), role, check], cwd=REPO, env=env,
                       timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tamper_output_code(cache: Path) -> Path:
    """The compiled graph's Python wrapper made to double its logits: code that still loads and runs."""
    marker = "        return (reinterpret_tensor("
    for path in cache.rglob("*.py"):
        text = path.read_text()
        if marker in text:
            lines = text.splitlines(keepends=True)
            at = max(i for i, line in enumerate(lines) if line.startswith(marker))
            buf = lines[at][len(marker):].split(",")[0]
            lines.insert(at, f"        {buf}.mul_(2.0)\n")
            path.write_text("".join(lines))
            return path
    raise AssertionError(f"no compiled wrapper in {cache}")


@pytest.mark.slow
def test_a_tampered_inductor_cache_is_refused_for_the_target_and_never_used_for_a_draft(tmp_path):
    cache = tmp_path / "compiled"
    clean = compiled_run(cache)                               # compiles, and fills the cache
    assert clean["gap"] < 1e-5 and clean["fallback"] is None
    tamper_output_code(cache)
    control = compiled_run(cache, check="off")                # the check disabled: the tampered code runs
    assert control["gap"] > 1e-3, control
    refused = compiled_run(cache)
    assert "disagrees with eager" in refused.get("refused", ""), refused
    draft = compiled_run(cache, role="draft")                 # a draft's model: eager, said in its fallback
    assert draft["gap"] < 1e-5 and "disagrees with eager" in (draft["fallback"] or ""), draft
    for path in cache.rglob("*.py"):                          # truncated code: refused, never a traceback
        path.write_text(path.read_text()[: len(path.read_text()) // 2])
    assert "engine=compiled cannot run the target" in compiled_run(cache).get("refused", "")
