"""The sampling primitives: inverse-CDF draws, residuals, temperature."""
import math

import pytest
import torch

from src.engine.sampling import (UniformBuffer, draw, probs_from_logits, residual_weights, sample,
                                 speculative_accept, uniforms)
from tests.chisquare import varying_multinomial_test

U_MAX = math.nextafter(1.0, 0.0)  # the largest uniform torch.rand(float64) can return


def test_draw_never_picks_a_zero_weight_char():
    w = [0.0, 0.3, 0.0, 0.0, 0.7, 0.0, 0.0]
    picks = {draw(w, u) for u in [0.0, 1e-300, 0.3 - 1e-17, 0.3, 0.5, 0.9999, U_MAX]}
    assert picks == {1, 4}
    assert draw([0.0, 0.0, 2.5], 0.0) == 2 and draw([1e-300, 0.0], U_MAX) == 0


def test_sample_matches_the_distribution():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(12, generator=g), -1)
    chars = torch.tensor([sample(probs, g) for _ in range(20000)])
    # false-failure rate 1e-4 for a correct sampler
    assert varying_multinomial_test(chars, probs.expand(20000, 12))[2] > 1e-4


def test_residual_falls_back_to_p_when_p_equals_q():
    p = [0.2, 0.5, 0.3]
    assert residual_weights(p, p) == p
    assert residual_weights([0.2, 0.5, 0.3], [0.4, 0.4, 0.2]) == pytest.approx([0.0, 0.1, 0.1])


def test_accept_when_draft_equals_target_and_greedy_rules():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(5, 9, generator=g), -1)
    for _ in range(100):  # q == p exactly: u * q < p always holds
        n, _ = speculative_accept(p, p[:4], [int(torch.multinomial(p[i], 1, generator=g)) for i in range(4)], g)
        assert n == 4
    one_hot = probs_from_logits(torch.randn(5, 9, generator=g), 0.0)
    target_chars = one_hot.argmax(-1).tolist()
    wrong = (target_chars[1] + 1) % 9
    q = torch.nn.functional.one_hot(torch.tensor([target_chars[0], wrong, 0, 0]), 9).float()
    n, nxt = speculative_accept(one_hot, q, [target_chars[0], wrong, 0, 0], g)
    assert (n, nxt) == (1, target_chars[1])  # greedy: keep the match, correct to the argmax


def test_temperature():
    logits = torch.tensor([1.0, 2.0, 3.0])
    assert torch.equal(probs_from_logits(logits, 0.0), torch.tensor([0.0, 0.0, 1.0]))
    assert torch.allclose(probs_from_logits(logits, 2.0), torch.softmax(logits / 2, -1))
    with pytest.raises(ValueError):
        probs_from_logits(logits, -1.0)


def test_uniform_buffer_hands_out_the_generators_stream_in_order():
    """Blocks of the generator's own draws, in order; a take that does not fit the block's rest
    starts a new block (the rest is dropped, never handed out twice); a take larger than a block
    gets a block of its size."""
    stream = torch.rand(60, generator=torch.Generator().manual_seed(3), dtype=torch.float64).tolist()
    buf = UniformBuffer(torch.Generator().manual_seed(3), block=8)
    assert buf.take(3) + uniforms(4, buf) == stream[:7]   # uniforms() reads a buffer too
    assert buf.take(2) == stream[8:10]                     # stream[7] dropped with the first block
    assert buf.take(6) == stream[10:16]
    assert buf.take(11) == stream[16:27]                   # larger than a block
    assert buf.take(1) == stream[27:28]
    assert buf.take(8) == stream[35:43]                    # the rest of 7 does not fit: a new block
