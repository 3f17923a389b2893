"""The capability table (src/trial/capabilities.py) against the checks and the texts made from it.

Every combination of engine, verify, batch, policy and draft, on a model of the tool's and on a
model from a folder (model=hf), is given to `trial_spec`: it must run exactly where the table says
it runs, and where it does not, be refused in one line (SpecsweepError). Mutations caught (each tried): a refusal
written beside the table (onnx at batch > 1 refused by name), a check that lets through what the
table refuses (transformers' trees), and a row changed in the table only (the generated copies
differ: the negative control below).
"""
from __future__ import annotations

import copy
import itertools

import pytest
from omegaconf import open_dict

from src.door import group_options
from src.engine.errors import SpecsweepError
from src.trial import capabilities as can
from src.trial.spec import POLICY_OPTIONS, trial_spec
from tests.conftest import compose_cfg

TREE_K = 4   # conf/verify/tree.yaml's shape is 4 deep


def test_the_table_names_every_engine_policy_verify_and_draft():
    from src.engine.runtimes.engines import ENGINES
    assert [e.name for e in can.ENGINES] == list(ENGINES)
    assert sorted(e.name for e in can.ENGINES) == group_options("engine")
    assert sorted(can.ALL_POLICIES) == group_options("policy") == sorted(POLICY_OPTIONS)
    assert sorted(v.name for v in can.VERIFIES) == group_options("verify")
    assert [d.name for d in can.conf_drafts()] == group_options("draft")
    assert [d.name for d in can.conf_drafts() if d.from_folder] == ["hf_model"]


def expected(e: can.Engine, d: can.Draft, tree: bool, batch: int, p: can.Policy, folder_target: bool) -> bool:
    """The table's word on one combination."""
    verify = can.verify("tree" if tree else "chain")
    if not d.runs_on(e) or (tree and not (e.trees and p.trees)):
        return False
    if batch > 1 and not (e.batch and d.batch() and p.batch and verify.batch):
        return False
    if p.name not in d.policies(e):
        return False
    if folder_target:
        return batch == 1 and d.for_folder_target(e) and (not tree or "tree" in e.folder)
    return True


@pytest.fixture(scope="module")
def folder_target(tiny, tmp_path_factory):
    """A model from a folder to be the target: another shape than the folder draft's (random weights)."""
    import torch
    from src.engine.huggingface.checkpoint import char_tokenizer, offline_transformers
    _, _, target = tiny
    t = offline_transformers()
    folder = tmp_path_factory.mktemp("folder_target")
    torch.manual_seed(0)
    config = t.GPT2Config(vocab_size=target.tokenizer.vocab_size, n_positions=target.model.cfg.block_size, n_embd=48,
                          n_layer=1, n_head=2, bos_token_id=None, eos_token_id=None)
    t.GPT2LMHeadModel(config).save_pretrained(folder)
    char_tokenizer(target.tokenizer.chars).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def nodes(tiny, folder_draft_model, folder_target):
    """The group nodes to combine: each engine, verify, policy and draft as conf/ composes them."""
    cfg, _, _ = tiny

    def group(name, option, *extra):
        return compose_cfg(cfg.data.path, cfg.data.cache_dir, f"{name}={option}", *extra)[name]
    base = compose_cfg(cfg.data.path, cfg.data.cache_dir, "n_chars=8")
    folder = group("model", "hf", f"model.path={folder_target}")
    return {"base": base, "folder": folder,
            "engine": {n: group("engine", n) for n in group_options("engine")},
            "verify": {n: group("verify", n) for n in group_options("verify")},
            "policy": {n: group("policy", n) for n in group_options("policy")},
            "draft": {n: group("draft", n, *([f"draft.model.path={folder_draft_model}"] if n == "hf_model" else []))
                      for n in group_options("draft")}}


def test_every_combination_runs_or_is_refused_as_the_table_says(nodes):
    drafts = {d.name: d for d in can.conf_drafts()}
    wrong, refused = [], 0
    for e, d, tree, batch, p, folder_target in itertools.product(
            can.ENGINES, drafts.values(), (False, True), (1, 2), can.POLICIES, (False, True)):
        cfg = copy.deepcopy(nodes["base"])
        with open_dict(cfg):
            cfg.engine, cfg.verify = nodes["engine"][e.name], nodes["verify"]["tree" if tree else "chain"]
            cfg.policy, cfg.draft, cfg.batch, cfg.k = nodes["policy"][p.name], nodes["draft"][d.name], batch, TREE_K
            if folder_target:
                cfg.model = nodes["folder"]
        try:
            trial_spec(cfg)
            runs, why = True, ""
        except SpecsweepError as err:
            runs, why = False, str(err)
            refused += 1
            assert "\n" not in why
        if runs != expected(e, d, tree, batch, p, folder_target):
            wrong.append(f"engine={e.name} draft={d.name} verify={'tree' if tree else 'chain'} batch={batch} "
                         f"policy={p.name} model={'hf' if folder_target else 'tiny'}: "
                         f"{'runs' if runs else 'refused: ' + why}")
    assert wrong == [], "\n".join(wrong[:20])
    total = len(can.ENGINES) * len(drafts) * 2 * 2 * len(can.POLICIES) * 2
    assert 0 < refused < total   # both answers were given


def test_the_generated_copies_are_current():
    """--help's table, the README's and the `# runs:` line of each conf file: rewrite them with
    `python -m src.trial.capabilities --write`."""
    stale = [str(path) for path, text in can.generated().items() if path.read_text() != text]
    assert stale == [], f"stale: {stale}; run python -m src.trial.capabilities --write"


def test_a_changed_row_changes_the_generated_copies(monkeypatch):
    """The negative control of the test above: onnx without batches, in the table only."""
    rows = tuple(e if e.name != "onnx" else can.Engine(**{**e.__dict__, "batch": False}) for e in can.ENGINES)
    monkeypatch.setattr(can, "ENGINES", rows)
    stale = {path.name for path, text in can.generated().items() if path.read_text() != text}
    assert {"onnx.yaml", "README.md", "specsweep.yaml"} <= stale
