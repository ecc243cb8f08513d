"""MuZero's inference where the model is: the latents of every game's tree, kept by the
inference broker (or a local actor), and each search round's queries answered in one
forward pass over all connections.

The broker keeps one :class:`LatentSearchBehaviour` per actor connection, as it keeps
any behaviour; its state is the latent of every node of the connection's ``n`` trees,
``[n, num_simulations + 1, L]``. A round's ``step``/``latent_search``
(:mod:`zmqrl.parts.muzero.messages`) has, per game, a root query (an observation: the
representation network makes the root's latent) or a recurrent one (a node the broker
holds and an action: the dynamics network makes the child's latent and reward); the
prediction network then gives every new latent its policy and value. ``act_batched``
joins the queries of all connections waiting into one forward pass, so each
simulation's inference is batched across all games of all actors.

A query for a latent this behaviour does not hold (the broker restarted, or forgot a
silent connection) is refused with an ``error`` that names it: latents cannot be made
up, and the actor answers by searching the move again from its roots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from zmqrl.bus import wire
from zmqrl.parts.acting.behaviour import ActingSetup, Behaviour, host
from zmqrl.parts.muzero.messages import LATENT_SEARCH

if TYPE_CHECKING:
    import torch

# What a refusal for lost latents says: the actor searches the move again from its roots.
SEARCH_AGAIN = "search again from the root"


class LatentSearchBehaviour(Behaviour):
    ships = ""  # nothing: the actor sends its positions to the replay itself
    steps_envs = False  # simulations of a search, not env steps: the actor counts its moves
    step_variant = LATENT_SEARCH

    @classmethod
    def held_bytes_per_env(cls, setup: ActingSetup) -> int:
        # every node's latent (float32) and whether it is held, per game
        return (int(setup.cfg.num_simulations) + 1) * (int(setup.model.latent_size) * 4 + 1)

    def __init__(self, setup: ActingSetup, n: int):
        super().__init__(setup, n)
        self.nodes = int(setup.cfg.num_simulations) + 1
        self.latent_size = int(setup.model.latent_size)
        self.latents = np.zeros((n, self.nodes, self.latent_size), np.float32)
        self.held = np.zeros((n, self.nodes), np.bool_)  # which latents exist
        self.query: dict[str, np.ndarray] = {}
        self._outputs: dict[str, np.ndarray] = {}

    def observe_step(self, msg: Any) -> None:
        """A round's queries (checked against ``step``/``latent_search`` already)."""
        root, parent, node = msg["root"], msg["parent"], msg["node"]
        if int(node.max(initial=0)) >= self.nodes or int(parent.max(initial=0)) >= self.nodes:
            raise wire.ProtocolError(f"step queries node {int(max(node.max(), parent.max()))}"
                                     f", but a tree has {self.nodes} (algo.num_simulations + 1)")
        if (node[root] != 0).any() or (node[~root] == 0).any():
            raise wire.ProtocolError("step queries must keep a root's latent at node 0 "
                                     "and every other at a node >= 1")
        rows = np.flatnonzero(~root)
        missing = rows[~self.held[rows, parent[rows]]]
        if len(missing):
            i = int(missing[0])
            raise wire.ProtocolError(
                f"step asks for the child of node {int(parent[i])} of game {i}, whose latent "
                f"this broker does not hold (it restarted or forgot the connection): "
                f"{SEARCH_AGAIN}")
        obs = np.zeros((self.n, *self.spec.obs_shape), self.spec.obs_dtype)
        obs[root] = msg["obs"]
        self.obs = obs
        self.query = {"root": root, "obs": obs,
                      "latent": self.latents[np.arange(self.n), parent],
                      "action": msg["action"], "node": node}

    def inputs(self) -> dict[str, np.ndarray]:
        q = self.query
        return {"root": q["root"], "obs": q["obs"], "latent": q["latent"],
                "action": q["action"]}

    @staticmethod
    def forward(model: torch.nn.Module, inputs: dict[str, torch.Tensor]
                ) -> dict[str, np.ndarray]:
        import torch

        from zmqrl.parts.muzero.support import support_to_scalar

        root = inputs["root"]
        latent = inputs["latent"].clone()
        reward = torch.zeros(len(root), device=latent.device)
        if bool(root.any()):
            latent[root] = model.represent(inputs["obs"][root]).to(latent.dtype)
        step = ~root
        if bool(step.any()):
            nxt, reward_logits = model.dynamics(inputs["latent"][step], inputs["action"][step])
            latent[step] = nxt.to(latent.dtype)
            reward[step] = support_to_scalar(reward_logits.float(), model.support_size)
        logits, value_logits = model.predict(latent)
        value = support_to_scalar(value_logits.float(), model.support_size)
        return {"latent": host(latent), "logits": host(logits), "value": host(value),
                "reward": host(reward)}

    def record(self, outputs: dict[str, np.ndarray], version: int) -> np.ndarray:
        q = self.query
        root, node = q["root"], q["node"]
        if root.any():  # a new search: the old tree's latents are done with
            self.held[root] = False
        games = np.arange(self.n)
        self.latents[games, node] = outputs["latent"]
        self.held[games, node] = True
        self._outputs = outputs
        return outputs["logits"].argmax(-1).astype(np.int64)

    def reply(self, actions: np.ndarray) -> dict[str, np.ndarray]:
        out = self._outputs
        return {"action": actions, "logits": out["logits"], "value": out["value"],
                "reward": out["reward"]}

    def _outcome(self, reward: np.ndarray, done: np.ndarray, truncated: np.ndarray,
                 final_obs: np.ndarray) -> None:
        pass  # queries have no outcome: the actor steps its envs itself
