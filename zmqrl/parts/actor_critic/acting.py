"""Actor-critic acting (the ``unroll`` family: V-trace, A2C, PPO): sample from the
policy and cut time-major unrolls with the behaviour log-probs (``zmqrl.parts.unroll``).

With a recurrent policy (``lstm_ac``) the behaviour keeps each env's LSTM state, resets
it where an episode ends, and every unroll carries the state its first step acted with.
An episode cut by a time limit is bootstrapped with V(final observation), continuing
the env's memory for a recurrent policy.
"""

from __future__ import annotations

import numpy as np
import torch

from zmqrl.bus import wire
from zmqrl.parts.acting.behaviour import ActingSetup, Behaviour, Item, host
from zmqrl.parts.models import bootstrap_truncated
from zmqrl.parts.unroll import PolicyState, UnrollBuilder


class ActorCriticBehaviour(Behaviour):
    ships = wire.UNROLL

    def __init__(self, setup: ActingSetup, n: int, unroll: int | None = None):
        super().__init__(setup, n)
        recurrent = getattr(self.model, "recurrent", False)
        state_size = self.model.state_size if recurrent else 0
        self.state = PolicyState(n, state_size) if recurrent else None
        self.builder = UnrollBuilder(self.spec, unroll or setup.cfg.unroll, n, state_size)
        self.discount = setup.cfg.discount
        self.reward_scale = getattr(setup.cfg, "reward_scale", 1.0)

    def observe(self, obs: np.ndarray, fields: dict | None = None) -> None:
        super().observe(obs, fields)
        finished = self.builder.observe(obs)
        if finished is not None:
            unroll, version = finished
            self._ready.append(Item(wire.UNROLL, unroll, {"version": version}))

    def inputs(self) -> dict[str, np.ndarray]:
        if self.state is None:
            return {"obs": self.obs}
        first, h, c = self.state.inputs()
        return {"obs": self.obs, "first": first, "h": h, "c": c}

    @staticmethod
    def forward(model: torch.nn.Module, inputs: dict[str, torch.Tensor]
                ) -> dict[str, np.ndarray]:
        if "h" not in inputs:
            action, logp = model.act(inputs["obs"])
            return {"action": action.cpu().numpy(), "logp": host(logp)}
        action, logp, (h, c) = model.step(inputs["obs"], inputs["first"],
                                          (inputs["h"], inputs["c"]))
        return {"action": action.cpu().numpy(), "logp": host(logp), "h": host(h), "c": host(c)}

    def greedy(self) -> np.ndarray | None:
        """The policy's mode: the likeliest action, or a Gaussian's mean. A recurrent
        policy's greedy play would need its own state: None (it samples)."""
        if self.state is not None:
            return None
        with torch.inference_mode():
            head = self.model(self.setup.to_device.batch(self.inputs())["obs"])[0]
        if self.spec.num_actions is not None:
            return head.argmax(-1).cpu().numpy().astype(self.spec.action_dtype)
        return host(head).astype(self.spec.action_dtype, copy=False)

    def record(self, outputs: dict[str, np.ndarray], version: int) -> np.ndarray:
        action = outputs["action"].astype(self.spec.action_dtype, copy=False)
        if self.state is None:
            self.builder.act(action, outputs["logp"], version)
        else:
            # The state the action was taken with (already zeroed where an episode
            # starts): what the unroll stores.
            self.builder.act(action, outputs["logp"], version, (self.state.h, self.state.c))
            self.state.advance(outputs["h"], outputs["c"])
        return action

    def _outcome(self, reward: np.ndarray, done: np.ndarray, truncated: np.ndarray,
                 final_obs: np.ndarray) -> None:
        if truncated.any():
            if self.state is None:
                reward = bootstrap_truncated(reward, truncated, final_obs, self.model,
                                             self.discount, self.reward_scale)
            else:  # V(final obs) continues the env's memory
                reward = np.array(reward, np.float32)
                reward[truncated] += self.discount * self.state.values_after(
                    self.model, final_obs, truncated) / self.reward_scale
        if self.state is not None:
            self.state.end_episodes(done)
        self.builder.outcome(reward, done)
