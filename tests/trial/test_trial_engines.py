"""A trial on another engine (engine=onnx on the tiny model): both arms on it, the compile
time logged apart, the engine named; bad engine settings refused when the spec is built."""
from __future__ import annotations

import pytest

from src.engine.errors import SpecsweepError
from src.trial.render import trial_block
from src.trial.spec import trial_spec
from src.trial.trial import run_trial
from tests.conftest import compose_cfg


def test_a_trial_on_the_onnx_engine(tiny):
    cfg, corpus, target = tiny
    spec = trial_spec(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=int8", "k=2", "engine=onnx",
                                  "timing.target_width=null", "timing.lock=false"))
    r = run_trial(spec, progress=False, loaded=(corpus, target))
    m = r.metrics
    assert r.info["engine"] == "onnx" and not any(key.startswith("engine_fallback") for key in r.info)
    # the target's widths: the prompt's prefill, 1 (baseline), k + 1 (verify); the draft's: its prefill, 1, 2
    assert m["compiled_graphs"] >= 5 and m["compile_s"] > 0
    assert m["proposed"] == 2 * m["target_passes"]
    assert m["chars_per_pass"] == pytest.approx(1 + m["accepted"] / m["target_passes"])  # a correction or bonus a pass
    assert "engine=onnx" in trial_block(spec, r) and "graphs in" in trial_block(spec, r)


@pytest.mark.parametrize("override,message", [
    ("engine.name=tpu", "unknown engine 'tpu'"),
    ("engine=compiled engine.mode=max-autotune", "cannot both be set"),
    ("engine=compiled +engine.options.nosuch_option=1", "torch._inductor.config has no nosuch_option"),
    ("engine=onnx device=cuda", "engine=onnx runs on the CPU"),
])
def test_bad_engine_settings_are_refused(tmp_path, override, message):
    with pytest.raises(SpecsweepError, match=message):
        trial_spec(compose_cfg(tmp_path / "missing.txt", tmp_path, *override.split()))
