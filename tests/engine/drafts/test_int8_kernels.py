"""The int8-kernel draft (conf/draft/int8_kernels.yaml): every Linear runs fbgemm's int8 GEMM,
a row's result does not depend on its batch (what lets `probs` score batches with the q
`propose` samples from), the error bound of its quantization, its memory report and bad input.

Its exactness per position, greedy equality and the propose/probs tie run in
tests/engine/decoding/test_exactness.py and tests/engine/decoding/test_decode.py, like every draft in conf/draft/.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from src.engine.errors import SpecsweepError
from src.engine.models.int8_linear import INPUT_QMAX, Int8Linear, calibration_windows, input_qparams, quantized_engine
from tests.conftest import compose_cfg
from tests.conftest import draft_for


def linear(n_in=96, n_out=64, seed=0, bias=False):
    lin = nn.Linear(n_in, n_out, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n_out, n_in, generator=torch.Generator().manual_seed(seed)) * 0.1)
    return lin


def test_every_linear_runs_int8_kernels_and_memory_is_counted_exactly(tiny, drafts):
    _, _, target = tiny
    draft = drafts["int8_kernels"]
    assert not any(type(m) is nn.Linear for m in draft.model.modules())
    linears = [m for m in target.model.modules() if isinstance(m, nn.Linear)]
    n_layer = target.model.cfg.n_layer
    assert len(linears) == 4 * n_layer + 1  # qkv, proj, two MLP layers per block, and the head
    d = draft.describe()
    assert d["engine"] == "x86" and d["int8_linears"] == len(linears) and d["calibration_windows"] == 32
    assert d["float32_bytes"] == 4 * target.model.n_params()
    linear_params = sum(m.weight.numel() for m in linears)
    # int8 weights + a float32 scale per output channel; every other parameter float32
    expected = linear_params + 4 * sum(m.out_features for m in linears) + 4 * (target.model.n_params() - linear_params)
    assert d["packed_bytes"] == expected


def test_a_row_does_not_depend_on_its_batch():
    """Fixed input scales: a batch's rows equal the rows computed one at a time, bitwise. The
    NEGATIVE CONTROL, fbgemm's dynamic linear on the same packed weights (one scale from each
    call's whole input), changes a row when other rows join it."""
    with quantized_engine("x86"):
        q = Int8Linear(linear(), -3.0, 3.0)
    x = torch.rand(40, 96, generator=torch.Generator().manual_seed(1)) * 6 - 3     # (40, 96) in range
    x[7] *= 0.1                                                                   # one row of small values
    rows = torch.cat([q(x[i:i + 1]) for i in range(40)])
    assert torch.equal(q(x), rows)
    assert torch.equal(q(x.view(4, 10, 96)), rows.view(4, 10, 64))
    dynamic = torch.ops.quantized.linear_dynamic(x, q.packed, True)
    assert not torch.equal(dynamic[7], torch.ops.quantized.linear_dynamic(x[7:8], q.packed, True)[0])


def test_draft_probs_of_a_batch_equal_probs_one_sequence_at_a_time(tiny, drafts):
    cfg, _, target = tiny
    draft = drafts["int8_kernels"]
    ids = target.tokenizer.encode("the cat sat on the mat and the dog ran to the cat")
    batch = torch.stack([ids[i:i + 20] for i in range(0, 24, 4)])                # (6, 20)
    together = draft.probs(batch, 1.0)
    assert torch.equal(together, torch.cat([draft.probs(row.unsqueeze(0), 1.0) for row in batch]))


def test_error_within_the_quantization_bound():
    """x in the calibrated range: |x_hat - x| <= s_x / 2 and |w_hat - w| <= s_w / 2 per output
    row, so |y_hat - y|_i <= sum_j (s_x / 2 |w_hat_ij| + |x_j| s_w_i / 2), plus float rounding."""
    lin = linear(bias=True)
    with torch.no_grad():
        lin.bias.copy_(torch.linspace(-1, 1, 64))
    with quantized_engine("x86"):
        q = Int8Linear(lin, -2.0, 3.0)
    x = torch.rand(32, 96, generator=torch.Generator().manual_seed(2)) * 5 - 2     # (32, 96) in [-2, 3]
    w = lin.weight.detach()
    s_w = w.abs().amax(1) / 127                                                   # (64,)
    w_hat_abs = w.abs() + s_w.unsqueeze(1) / 2                                   # >= |w_hat|
    bound = q.x_scale / 2 * w_hat_abs.sum(1) + x.abs() @ (s_w / 2).expand(96, 64)  # (32, 64)
    err = (q(x) - lin(x).detach()).abs()
    assert (err <= bound + 1e-4).all()
    assert err.mean() > 0  # really quantized


def test_input_qparams_cover_the_range_with_zero_exact():
    for lo, hi in [(-1.0, 3.0), (0.5, 2.0), (-2.0, -0.5), (-0.17, 5.3)]:
        scale, zp = input_qparams(lo, hi)
        assert 0 <= zp <= INPUT_QMAX
        # the codes 0..INPUT_QMAX reach from min(lo, 0) to max(hi, 0), within rounding
        assert -zp * scale <= min(lo, 0.0) + 1e-6 and (INPUT_QMAX - zp) * scale >= max(hi, 0.0) - scale / 2 - 1e-6


def test_engine_setting_is_restored_and_a_bad_engine_is_one_line(tiny):
    cfg, _, target = tiny
    before = torch.backends.quantized.engine
    with quantized_engine("fbgemm"):
        assert torch.backends.quantized.engine == "fbgemm"
    assert torch.backends.quantized.engine == before
    for override, message in [("draft.engine=qnnpack", "engine must be one of x86, fbgemm, got 'qnnpack'"),
                              ("draft.calibration_windows=0", "calibration_windows must be >= 1, got 0")]:
        bad = compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=int8_kernels", override)
        with pytest.raises(SpecsweepError) as e:   # refused by the spec, before any work
            draft_for(bad, target, tiny[1])
        assert str(e.value) == f"draft 'int8_kernels': {message}"


def test_calibration_windows_are_fixed_and_fit_a_short_text():
    ids = torch.arange(50)
    a, b = calibration_windows(ids, 4, 16), calibration_windows(ids, 4, 16)
    assert torch.equal(a, b) and a.shape == (4, 16)
    assert (a[:, 1:] - a[:, :-1] == 1).all()                 # contiguous windows of the text
    assert calibration_windows(ids, 2, 100).shape == (2, 49)  # shorter than the text
