"""The acting sampler (Gumbel-max over log-probabilities) draws from the policy's own
distribution and never picks an action whose probability is zero."""

from __future__ import annotations

import numpy as np
import torch

from zmqrl.parts.models.feedforward import sample_categorical


def test_draws_follow_the_probabilities():
    torch.manual_seed(0)
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.05, 0.05, 0.9]])
    draws = 40_000
    logp = torch.log(probs).repeat_interleave(draws, dim=0)
    actions = sample_categorical(logp).squeeze(-1).reshape(2, draws)
    assert actions.dtype == torch.int64
    for row in range(2):
        freq = np.bincount(actions[row].numpy(), minlength=3) / draws
        # 4 standard errors at 40k draws is below 0.01 for every p here
        np.testing.assert_allclose(freq, probs[row].numpy(), atol=0.01)


def test_a_masked_action_is_never_drawn_even_when_the_noise_is_extreme(monkeypatch):
    logp = torch.log_softmax(torch.tensor([[0.0, float("-inf"), 0.0]] * 50_000), dim=-1)
    assert not (sample_categorical(logp) == 1).any()
    # An Exp(1) draw of exactly 0 would make log E = -inf, and -inf - (-inf) is NaN,
    # which argmax would choose: the sampler keeps E above 0.
    monkeypatch.setattr(torch.Tensor, "exponential_", lambda self, *a, **k: self.zero_())
    assert torch.empty(3).exponential_().eq(0).all()  # the patch is in force
    assert not (sample_categorical(logp[:4]) == 1).any()
