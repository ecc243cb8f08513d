"""PPO's samples for a recurrent policy: minibatches of whole sequences, not single steps.

A recurrent policy's log-prob at step t depends on every earlier step of its unroll, so
PPO's usual minibatches of shuffled single steps cannot be evaluated. As CleanRL's
``ppo_atari_lstm.py`` and SB3-contrib's ``RecurrentPPO`` do, a minibatch here is a set
of env columns of the unroll, each whole and in time order, evaluated by ``model.unroll``
from the LSTM state the column started with (``state_h``/``state_c``, shipped with the
unroll by whoever acted) and reset wherever an episode ended inside it.

The samples are kept env-major ([B, T, ...]), so that ``PPOLearner`` indexes the
minibatch along axis 0 exactly as it does for flat steps; only the evaluation turns them
back to the time-major layout the model reads. Data-parallel learners need nothing more:
each rank splits its own columns and the gradients are averaged per step as usual.
"""

from __future__ import annotations

import torch

SEQUENCE_KEYS = ("obs", "first", "action", "logp", "value", "advantage", "return")


def sequence_samples(batch: dict[str, torch.Tensor], values: torch.Tensor,
                     advantages: torch.Tensor, returns: torch.Tensor
                     ) -> dict[str, torch.Tensor]:
    """Env-major sequences of an unroll batch (obs [T+1, B, ...], action/logp/done
    [T, B], state_h/state_c [1, B, H] or [B, H]) and its pre-update ``values`` [T+1, B],
    ``advantages`` and ``returns`` [T, B]: obs, first, action, logp, value, advantage,
    return as [B, T, ...], and state_h/state_c [B, H], the state each column's first
    step acted with. ``first[b, t]`` marks a step that starts an episode inside the
    column (done at t - 1); step 0's stored state is already reset where it has to be.
    """
    T = batch["action"].shape[0]
    done = batch["done"].bool()
    first = torch.cat([torch.zeros_like(done[:1]), done[:T - 1]])
    h, c = (batch[k][0] if batch[k].dim() == 3 else batch[k] for k in ("state_h", "state_c"))
    time_major = {
        "obs": batch["obs"][:T],  # the env's dtype: the model converts
        "first": first,
        "action": batch["action"],
        "logp": batch["logp"].float(),
        "value": values[:T],
        "advantage": advantages,
        "return": returns,
    }
    samples = {k: v.transpose(0, 1) for k, v in time_major.items()}
    samples["state_h"], samples["state_c"] = h.float(), c.float()
    return samples


def evaluate_sequences(model: torch.nn.Module, mb: dict[str, torch.Tensor]
                       ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor,
                                  torch.Tensor]:
    """The current policy on a minibatch of ``sequence_samples`` (b columns, with
    autograd): the minibatch's logp, value, advantage and return flattened to [b * T],
    and new log-probs, entropy and values [b * T] in the same order."""
    def time_major(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 1)

    # obs without the bootstrap row: model.unroll then returns T values, all with autograd.
    logp, entropy, values = model.unroll(time_major(mb["obs"]), time_major(mb["first"]),
                                         (mb["state_h"], mb["state_c"]),
                                         time_major(mb["action"]))
    old = {k: mb[k].reshape(-1) for k in ("logp", "value", "advantage", "return")}
    return old, *(time_major(x).reshape(-1) for x in (logp, entropy, values))
