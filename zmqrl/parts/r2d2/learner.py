"""R2D2 (Kapturowski et al. 2019): recurrent n-step double Q-learning on replayed
sequences with a stored recurrent state, burn-in and value rescaling. No sockets.

References: Kapturowski et al. 2019 (R2D2: stored state, burn-in, the eta priority
mix), Pohlen et al. 2018 (the invertible value rescaling h), van Hasselt et al. 2016
(double Q), Horgan et al. 2018 (Ape-X: actors compute initial priorities).

A replayed sequence (batch-major, as the replay returns it; L = sequence_length):

    obs      [B, L+1, ...]  obs[:, L] only bootstraps the last steps
    action   [B, L] int64
    reward   [B, L] float32
    done     [B, L] bool    the episode ended after action t; obs[:, t+1] is then the
                            first observation of the next episode (SAME_STEP autoreset:
                            sequences run across episode ends)
    state_h, state_c [B, H] float32: the recurrent state to use with obs[:, 0], already
                            zeroed if obs[:, 0] starts an episode
    weights  [B]            importance weights from prioritized replay (optional)

The network resets its state at obs t >= 1 where done[t-1] (``first_flags``). Steps
t < burn_in only warm the state up: they run without gradients, from the stored state,
for both the online and the target network, and enter neither the loss nor the
priorities. The n-step target of step t (double Q, in the rescaled space):

    m      = min(n, L - t) steps, cut after the first done among them (m' steps)
    target = h( sum_{k<m'} discount^k r_{t+k}
                + discount^m' (1 - ended) h_inv(Q_target(s_{t+m'}, argmax_a Q(s_{t+m'}, a))) )

so the last steps of a sequence bootstrap with fewer than n rewards (from obs L).
"""

from __future__ import annotations

import numpy as np
import torch

from zmqrl.parts.algos.optim import make_adam
from zmqrl.parts.algos.target_q import TargetQLearner
from zmqrl.parts.r2d2.config import R2D2Config

# ------------------------------------------------------------------ value rescaling


def h(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x: squashes returns (Pohlen et al.)."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1) - 1) + eps * x


def h_inv(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """The exact inverse of :func:`h`.

    The paper's closed form is sign(x) (a^2 - 1) with
    a = (sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps). Near x = 0 that subtracts
    nearly equal numbers; it is computed here as sign(x) (a - 1)(a + 1) with
    a - 1 = 2|x| / (sqrt(1 + 4 eps (|x| + 1 + eps)) + 1 + 2 eps), the same value
    without the cancellation.
    """
    ax = x.abs()
    root = torch.sqrt(1 + 4 * eps * (ax + 1 + eps))
    a_minus_1 = 2 * ax / (root + 1 + 2 * eps)
    return torch.sign(x) * a_minus_1 * (a_minus_1 + 2)


# ------------------------------------------------------------------ targets and TD


def first_flags(done: torch.Tensor) -> torch.Tensor:
    """Episode starts [L+1, B] for time-major ``done`` [L, B]: obs 0 never (its stored
    state is already reset), obs t >= 1 where done[t-1]."""
    first = torch.zeros((done.shape[0] + 1, *done.shape[1:]), dtype=torch.bool,
                        device=done.device)
    first[1:] = done.bool()
    return first


@torch.no_grad()
def n_step_rescaled_targets(q_online: torch.Tensor, q_target: torch.Tensor,
                            action: torch.Tensor, reward: torch.Tensor, done: torch.Tensor,
                            discount: float, n: int, eps: float = 1e-3) -> torch.Tensor:
    """Double-Q n-step targets [L, B] in the rescaled space (see the module docstring).

    Time-major: q_online/q_target [L+1, B, A] (Q of every observation of the sequence,
    in the rescaled space), reward/done [L, B]. ``action`` is not needed for the
    targets (they depend on the actions taken only through the rewards) and is accepted
    so that every sequence function takes the same arguments. No gradient flows.
    """
    del action
    L = reward.shape[0]
    reward = reward.to(q_target.dtype)
    done = done.bool()
    t_index = torch.arange(L, device=reward.device).unsqueeze(-1)  # [L, 1]
    ret = torch.zeros_like(reward)
    disc = torch.ones_like(reward)  # discount^m', or 0 once the episode ended
    steps = torch.zeros(reward.shape, dtype=torch.int64, device=reward.device)  # m'
    running = torch.ones_like(done)  # no episode end among the steps summed so far
    for k in range(min(n, L)):
        r_k = torch.zeros_like(reward)  # r_k[t] = reward[t + k] (inside the sequence)
        d_k = torch.zeros_like(done)
        r_k[: L - k], d_k[: L - k] = reward[k:], done[k:]
        inside = running & (t_index + k < L)
        ret = ret + torch.where(inside, discount**k * r_k, torch.zeros_like(r_k))
        disc = torch.where(inside, disc * discount, disc)
        disc = torch.where(inside & d_k, torch.zeros_like(disc), disc)
        steps = steps + inside
        running = inside & ~d_k
    best = q_online.argmax(dim=-1, keepdim=True)
    bootstrap = h_inv(q_target.gather(-1, best).squeeze(-1), eps)  # [L+1, B]
    bootstrap = bootstrap.gather(0, t_index + steps)  # the value of obs t + m'
    return h(ret + disc * bootstrap, eps)


def sequence_td(q_online: torch.Tensor, q_target: torch.Tensor, action: torch.Tensor,
                reward: torch.Tensor, done: torch.Tensor, discount: float, n: int,
                eps: float = 1e-3, burn_in: int = 0) -> torch.Tensor:
    """TD errors target - Q(s_t, a_t) [L - burn_in, B] of the learning steps t >= burn_in.

    Time-major, as :func:`n_step_rescaled_targets`. Gradients flow into ``q_online``
    through Q(s_t, a_t) of the learning steps only (targets are constants), so the loss
    has zero gradient w.r.t. the burn-in steps' Q. Targets of the learning steps never
    look before step burn_in, so passing only the learning part (burn_in=0) gives the
    same result: that is what the learner does, as it never computes burn-in Q with
    gradients.
    """
    q_online, q_target = q_online[burn_in:], q_target[burn_in:]
    action, reward, done = action[burn_in:], reward[burn_in:], done[burn_in:]
    targets = n_step_rescaled_targets(q_online, q_target, action, reward, done,
                                      discount, n, eps)
    q_taken = q_online[:-1].gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
    return targets - q_taken


def sequence_priorities(td_abs: torch.Tensor, eta: float = 0.9) -> torch.Tensor:
    """R2D2's priority of each sequence [B] from |td| [T_learn, B]:
    eta * max_t |td| + (1 - eta) * mean_t |td|."""
    return eta * td_abs.max(dim=0).values + (1 - eta) * td_abs.mean(dim=0)


def actor_priorities(q: np.ndarray, action: np.ndarray, reward: np.ndarray,
                     done: np.ndarray, cfg: R2D2Config) -> np.ndarray:
    """Initial priorities [B] float32 of sequences, computed where they are produced
    from the Q-values recorded while acting (no target network: Ape-X/R2D2 actors use
    their own network for both). Batch-major numpy: q [B, L+1, A], action/reward/done
    [B, L]; the same targets, TD and eta mix as the learner."""
    def tm(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(x)).transpose(0, 1)

    q_t = tm(q).float()
    td = sequence_td(q_t, q_t, tm(action), tm(reward).float(), tm(done), cfg.discount,
                     cfg.n_step, cfg.rescale_eps, cfg.burn_in)
    return sequence_priorities(td.abs(), cfg.eta).numpy().astype(np.float32)


# ------------------------------------------------------------------ learner




class R2D2Learner(TargetQLearner):
    """One prioritized R2D2 update per call over a batch of sequences; keeps a target
    network. The loss of a sequence is the mean over its learning steps of
    0.5 * td^2 in the rescaled space (squared, as in R2D2; no Huber), weighted by the
    sequence's importance weight, then averaged over the batch."""

    def __init__(self, cfg: R2D2Config, model: torch.nn.Module):
        super().__init__(cfg, model)
        self.optimizer = make_adam(self.params, cfg.lr, cfg.adam_eps, cfg.light_adam)

    def loss(self, batch: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
        """``batch``: the sequence layout of the module docstring (batch-major).
        Returns (loss, loss terms, new priorities [B] as float32 CPU)."""
        cfg = self.cfg
        b = cfg.burn_in
        obs = batch["obs"].transpose(0, 1)  # time-major [L+1, B, ...]; models convert
        action = batch["action"].long().transpose(0, 1)
        reward = batch["reward"].float().transpose(0, 1)
        done = batch["done"].bool().transpose(0, 1)
        first = first_flags(done)
        stored = (batch["state_h"].float(), batch["state_c"].float())
        online_state = target_state = stored
        if b > 0:
            with torch.no_grad():  # burn-in: warm both networks up from the stored state
                _, online_state = self.model(obs[:b], first[:b], stored)
                _, target_state = self.target_model(obs[:b], first[:b], stored)
        q, _ = self.model(obs[b:], first[b:], online_state)  # [L+1-b, B, A]
        with torch.no_grad():
            q_target, _ = self.target_model(obs[b:], first[b:], target_state)
        td = sequence_td(q, q_target, action[b:], reward[b:], done[b:], cfg.discount,
                         cfg.n_step, cfg.rescale_eps)  # [L-b, B]
        weights = batch.get("weight")
        per_sequence = 0.5 * td.pow(2).mean(dim=0)
        if weights is not None:
            per_sequence = per_sequence * weights.float()
        loss = per_sequence.mean()
        td_abs = td.detach().abs()
        priorities = sequence_priorities(td_abs, cfg.eta).float().cpu()
        q_taken = q.detach()[:-1].gather(-1, action[b:].unsqueeze(-1))
        terms = {"loss": loss.item(), "q_mean": q_taken.mean().item(),
                 "td_abs_mean": td_abs.mean().item()}
        return loss, terms, priorities
