"""Time-major unrolls for a vector of envs: what actors and the inference broker ship.

An unroll of length T holds ``obs`` [T+1, n, ...] (the last observation is for
bootstrapping and is also the first of the next unroll), ``action`` [T, n, ...],
behaviour ``logp`` [T, n], ``reward`` [T, n] and ``done`` [T, n] (the episode ended
after that action; the next observation is then the first of a new episode).

For a recurrent policy (``state_size`` > 0) it also holds ``state_h`` and ``state_c``
[1, n, H] float32: the LSTM state the policy used with obs[0], already zeroed where
obs[0] starts an episode. The leading axis of 1 keeps every array time-major, so
unrolls concatenate and split along axis 1 (env columns) like the other keys.
"""

from __future__ import annotations

import numpy as np
import torch

from zmqrl.parts.envs import EnvSpec


class UnrollBuilder:
    """Collects one vector of envs' steps and cuts an unroll every ``length`` steps.

    Per step: ``outcome(reward, done)`` for the previous action (if any), then
    ``observe(obs)`` (which returns a finished unroll when one is complete), then
    ``act(action, logp, version)``, or ``act(action, logp, version, (h, c))`` with the
    recurrent state [n, H] that the action was taken with when ``state_size`` > 0.
    """

    def __init__(self, spec: EnvSpec, length: int, n: int, state_size: int = 0):
        self.length = length
        self.n = n
        self.obs = np.zeros((length + 1, n, *spec.obs_shape), spec.obs_dtype)
        self.action = np.zeros((length, n, *spec.action_shape), spec.action_dtype)
        self.logp = np.zeros((length, n), np.float32)
        self.reward = np.zeros((length, n), np.float32)
        self.done = np.zeros((length, n), np.bool_)
        self.t = 0  # completed transitions in the current unroll
        self.pending = False  # an action was taken and its outcome not yet recorded
        self.version = 0  # parameter version that took the current unroll's first action
        self.state_size = state_size
        if state_size > 0:  # the state used with obs[0] of the current unroll
            self.state_h = np.zeros((1, n, state_size), np.float32)
            self.state_c = np.zeros((1, n, state_size), np.float32)

    def outcome(self, reward: np.ndarray, done: np.ndarray) -> None:
        if self.pending:
            self.reward[self.t] = reward
            self.done[self.t] = done
            self.t += 1
            self.pending = False

    def observe(self, obs: np.ndarray) -> tuple[dict[str, np.ndarray], int] | None:
        """Record the current observation; return a finished unroll (copies) and the
        parameter version that took its first action, if one is complete."""
        self.obs[self.t] = obs
        if self.t < self.length:
            return None
        unroll = {"obs": self.obs.copy(), "action": self.action.copy(), "logp": self.logp.copy(),
                  "reward": self.reward.copy(), "done": self.done.copy()}
        if self.state_size > 0:
            unroll["state_h"] = self.state_h.copy()
            unroll["state_c"] = self.state_c.copy()
        self.obs[0] = obs
        self.t = 0
        return unroll, self.version

    def act(self, action: np.ndarray, logp: np.ndarray, version: int,
            state: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Record the action taken on the current observation; ``state`` (h, c) [n, H]
        is the recurrent state it was taken with (after any reset), needed when
        ``state_size`` > 0 and ignored otherwise."""
        if self.t == 0:
            self.version = version  # the unroll's policy lag is measured from here
            if self.state_size > 0:
                if state is None:
                    raise ValueError("UnrollBuilder with state_size > 0: act() needs the "
                                     "recurrent state")
                # Copied into our own arrays: the caller keeps updating its state.
                self.state_h[0] = state[0]
                self.state_c[0] = state[1]
        self.action[self.t] = action
        self.logp[self.t] = logp
        self.pending = True


class PolicyState:
    """The LSTM state of n envs under a recurrent actor-critic (``lstm_ac``) between
    steps, kept by the actor-critic behaviour of each connection
    (``zmqrl.parts.actor_critic.acting``), batched with the others into one forward pass.

    Per step: ``inputs()`` gives (first, h, c) with the state already zeroed where an
    episode starts (what the unroll stores), ``advance(h2, c2)`` keeps the state after
    the step, ``values_after(model, obs, rows)`` evaluates a truncated episode's final
    observation from it, and ``end_episodes(done)`` zeroes the envs whose episode ended.
    """

    def __init__(self, n: int, size: int):
        self.n = n
        self.h = np.zeros((n, size), np.float32)
        self.c = np.zeros((n, size), np.float32)
        self.first = np.ones(n, np.bool_)

    def inputs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.first, self.h, self.c

    def advance(self, h: np.ndarray, c: np.ndarray) -> None:
        self.h, self.c = np.array(h, np.float32), np.array(c, np.float32)
        self.first = np.zeros(self.n, np.bool_)

    def values_after(self, model: torch.nn.Module, obs: np.ndarray,
                     rows: np.ndarray) -> np.ndarray:
        """V(obs) for the envs in ``rows`` (bool [n]), continuing their current state."""
        device = next(model.parameters()).device
        state = (torch.from_numpy(self.h[rows]).to(device),
                 torch.from_numpy(self.c[rows]).to(device))
        first = torch.zeros(int(rows.sum()), dtype=torch.bool, device=device)
        return model.step_values(torch.from_numpy(np.asarray(obs)).to(device), first,
                                 state).float().cpu().numpy()

    def end_episodes(self, done: np.ndarray) -> None:
        self.h[done] = 0.0
        self.c[done] = 0.0
        self.first = np.asarray(done, np.bool_).copy()
