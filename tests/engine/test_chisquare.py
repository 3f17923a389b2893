"""The chi-square helper itself: calibrated under the null, powerful against a shifted law."""
import math

import torch

from tests.chisquare import chi2_sf, varying_multinomial_test


def test_chi2_sf_known_values():
    # chi-square(2) survival is exp(-x/2); chi-square(1) at 3.841 is 0.05
    assert abs(chi2_sf(4.0, 2) - math.exp(-2.0)) < 1e-12
    assert abs(chi2_sf(3.841458820694124, 1) - 0.05) < 1e-6


def test_null_p_values_are_uniform_and_shift_is_caught():
    g = torch.Generator().manual_seed(0)
    V, N, trials = 6, 2000, 200
    p_values = []
    for _ in range(trials):
        probs = torch.softmax(torch.randn(N, V, generator=g), -1)       # a different law per draw
        chars = torch.multinomial(probs, 1, generator=g).squeeze(1)
        p_values.append(varying_multinomial_test(chars, probs)[2])
    p_values = torch.tensor(p_values)
    # under the null P(p < 0.05) = 0.05; over 200 trials the count is Binomial(200, 0.05):
    # mean 10, sd 3.1. Bounds 1..25 hold with probability > 0.9999.
    assert 1 <= int((p_values < 0.05).sum()) <= 25
    # a mild shift of the sampling law (10% mass moved to cell 0) must be rejected
    probs = torch.softmax(torch.randn(N * 5, V, generator=g), -1)
    shifted = 0.9 * probs + 0.1 * torch.nn.functional.one_hot(torch.zeros(N * 5, dtype=torch.long), V)
    chars = torch.multinomial(shifted, 1, generator=g).squeeze(1)
    assert varying_multinomial_test(chars, probs)[2] < 1e-6
