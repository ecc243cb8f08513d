"""A3C's worker: actor-critic acting whose unrolls become gradients on the spot.

It cuts unrolls exactly as :class:`ActorCriticBehaviour` and, for each one, computes
the algorithm's gradients with the local model and ships those (``grads``, one array
per trainable parameter) instead of the unroll; the parameter server applies them and
replies with fresh parameters.
"""

from __future__ import annotations

import torch

from zmqrl.bus import wire
from zmqrl.parts.acting.behaviour import ActingSetup, Item
from zmqrl.parts.actor_critic.acting import ActorCriticBehaviour
from zmqrl.parts.algos import make_algo


class GradientBehaviour(ActorCriticBehaviour):
    ships = wire.GRADS

    def __init__(self, setup: ActingSetup, n: int):
        super().__init__(setup, n)
        self.worker = make_algo(setup.cfg, self.model)
        self.names = [name for name, p in self.model.named_parameters() if p.requires_grad]

    def take(self) -> list[Item]:
        out = []
        for item in super().take():
            unroll = item.arrays  # (a recurrent policy's unrolls carry state_h/state_c)
            grads, _ = self.worker.gradients({k: torch.from_numpy(v) for k, v in unroll.items()})
            arrays = {n: g.numpy() for n, g in zip(self.names, grads, strict=True)}
            env_steps = int(unroll["action"].shape[0] * unroll["action"].shape[1])
            out.append(Item(wire.GRADS, arrays, {"version": item.fields["version"],
                                                 "env_steps": env_steps}))
        return out
