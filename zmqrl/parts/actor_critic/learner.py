"""What every actor-critic learner shares: evaluating the current policy and values on
a time-major unroll batch (through ``model.evaluate``: discrete or continuous actions),
and the baseline + entropy terms added to a policy term, reported under the same names
(IMPALA, A2C, IMPACT, PPO)."""

from __future__ import annotations

import torch


def actor_critic_loss(loss_policy: torch.Tensor, value_error: torch.Tensor,
                      entropy: torch.Tensor, baseline_cost: float, entropy_cost: float
                      ) -> tuple[torch.Tensor, dict[str, float]]:
    """``loss_policy + baseline_cost * 0.5 * mean(value_error^2) - entropy_cost * mean(H)``."""
    loss_baseline = baseline_cost * 0.5 * (value_error**2).mean()
    loss_entropy = -entropy_cost * entropy.mean()
    loss = loss_policy + loss_baseline + loss_entropy
    terms = {
        "loss_policy": loss_policy.item(),
        "loss_baseline": loss_baseline.item(),
        "loss_entropy": loss_entropy.item(),
        "loss_total": loss.item(),
    }
    return loss, terms


def evaluate_unrolls(model: torch.nn.Module, batch: dict[str, torch.Tensor]
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The current policy on an unroll batch (obs [T+1, B, ...], action [T, B] discrete or
    [T, B, *action_shape] continuous): log-probs of the taken actions [T, B], policy
    entropy [T, B], values [T+1, B] (the last row is the bootstrap).

    Goes through ``model.evaluate(obs, action)``, so it serves any action space the
    model does. The bootstrap row is computed without autograd: every learner treats it
    as a constant (and the policy is not evaluated on it).

    Recurrent models (``model.recurrent``) go through ``model.unroll`` instead, from the
    state the unroll started with, ``batch["state_h"]``/``["state_c"]`` ([1, B, H] as
    ``UnrollBuilder`` ships it, or [B, H]), already reset for obs[0]; the LSTM is reset
    after every ``done``."""
    if getattr(model, "recurrent", False):
        return _evaluate_recurrent(model, batch)
    T, B = batch["action"].shape[:2]
    obs = batch["obs"]  # the env's dtype: the model converts (uint8 frames where it runs)
    flat_obs = obs.reshape((T + 1) * B, *obs.shape[2:])
    action = batch["action"].reshape(T * B, *batch["action"].shape[2:])
    target_logp, entropy, values = model.evaluate(flat_obs[:T * B], action)
    # state_values runs under inference_mode: clone to get an ordinary tensor that may
    # meet autograd-recorded ops.
    bootstrap = model.state_values(flat_obs[T * B:]).clone()
    values = torch.cat([values, bootstrap.to(values.dtype)]).reshape(T + 1, B)
    return target_logp.reshape(T, B), entropy.reshape(T, B), values


def _evaluate_recurrent(model: torch.nn.Module, batch: dict[str, torch.Tensor]
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    done = batch["done"].bool()
    # first[t] = done[t-1]; first[0] = False: the stored state is already the one to use
    # with obs[0] (zeroed by the actor if obs[0] starts an episode).
    first = torch.cat([torch.zeros_like(done[:1]), done])
    # [1, B, H] keeps the unroll time-major, so that batching and column slicing along
    # axis 1 treat it like every other key; [B, H] is accepted too.
    h, c = (batch[k][0] if batch[k].dim() == 3 else batch[k] for k in ("state_h", "state_c"))
    return model.unroll(batch["obs"], first, (h.float(), c.float()), batch["action"])
