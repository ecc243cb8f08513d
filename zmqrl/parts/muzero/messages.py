"""MuZero's messages: its search queries to the inference broker and its replay items,
declared as a plug-in declares its own (``zmqrl.bus.messages.MessageSet``, registered in
the ``zmqrl.messages`` entry-point group of zmqrl's pyproject.toml).

* ``step``/``latent_search`` (actor → broker): one query per game of a lane, all of one
  search round. A **root** query carries the game's observation (initial inference:
  representation, then prediction); the others name a node of the game's tree whose
  latent the broker holds and the action to take from it (recurrent inference:
  dynamics, then prediction). Each says at which node the broker keeps the new latent,
  so the latents never cross the wire: the actor holds only its trees.
* ``act``/``latent_search`` (broker → actor): per query the policy logits, the value and
  the reward predicted (0 at a root), as scalars (the broker inverts the support).
* ``insert``/``search_targets`` and ``batch``/``search_targets``: a position and the
  targets of the ``K`` steps unrolled from it (actions, rewards, n-step values, visit
  distributions), with a mask that ends them where the episode ended; with
  ``algo.reanalyse``, also what recomputing them takes.
* ``revise``/``search_targets`` (reanalyse → replay): fresh value and policy targets
  for held items, by key.
"""

from __future__ import annotations

from zmqrl.bus import wire
from zmqrl.bus.messages import (
    BATCH_HEAD,
    REPLAY_SOURCE,
    Array,
    Field,
    MessageSet,
    MessageSpec,
    RowsPerTrue,
    Together,
)
from zmqrl.parts.muzero.config import BOOTSTRAP_ARRAYS

LATENT_SEARCH = "latent_search"  # the step/act variant
SEARCH_TARGETS = "search_targets"  # the insert/batch variant (MuZeroConfig.items)


def _targets(*head: Array) -> tuple[Array, ...]:
    return (
        *head,
        Array("obs", "obs", ("B", "*obs"), rules=("bounded",),
              doc="the observation at position t, the root of the unroll"),
        Array("action", "int64", ("B", "K"), rules=("action",),
              doc="actions taken at t..t+K-1 (arbitrary where `mask` ends the episode)"),
        Array("reward", "float32", ("B", "K"), rules=("bounded",),
              doc="the reward each of those actions earned"),
        Array("value", "float32", ("B", "K+1"), rules=("bounded",),
              doc="n-step value targets of t..t+K (0 past the episode's end)"),
        Array("policy", "float32", ("B", "K+1", "A"), rules=("distribution",),
              doc="the search's visit distributions at t..t+K (uniform past the end)"),
        Array("mask", "bool", ("B", "K+1"),
              doc="position t+k lies inside the episode (`mask[:, 0]` true)"),
        # What a reanalyse node re-searches (`algo.reanalyse`): z = partial_return +
        # bootstrap_discount * v(obs_bootstrap) recomputes `value` with any network.
        Array("obs_unroll", "obs", ("B", "K", "*obs"), False, ("bounded",),
              "reanalyse, or `algo.consistency_cost`: the observations at t+1..t+K "
              "(zeros past the episode's end)"),
        Array("obs_bootstrap", "obs", ("B", "K+1", "*obs"), False, ("bounded",),
              "reanalyse: the observation each value target bootstraps from (zeros where "
              "none)"),
        Array("partial_return", "float32", ("B", "K+1"), False, ("bounded",),
              "reanalyse: the reward sum of each value target"),
        Array("bootstrap_discount", "float32", ("B", "K+1"), False, ("unit",),
              "reanalyse: the discount of each value target's bootstrap (0: none)"),
    )


_QUERY = (
    Array("root", "bool", ("n",), doc="game `i` asks for the initial inference of its "
                                      "next `obs` row (a new search), else a recurrent one"),
    Array("obs", "obs", ("m", "*obs"), rules=("bounded",),
          doc="the observations of the root queries, in game order"),
    Array("parent", "int32", ("n",), rules=("nonneg",),
          doc="recurrent: the node whose latent the dynamics starts from (0 at a root)"),
    Array("action", "int64", ("n",), rules=("action",),
          doc="recurrent: the action taken from `parent` (0 at a root)"),
    Array("node", "int32", ("n",), rules=("nonneg",),
          doc="where the broker keeps the new latent: node 0 at a root, a new node "
              "(at most `algo.num_simulations`) otherwise"),
)

MESSAGES = MessageSet(
    symbols={"K": ("MuZero's unroll steps, `algo.unroll_steps`", 1)},
    messages=(
        MessageSpec(
            wire.STEP, "One round of MuZero searches: a query per game (`muzero`).",
            "search actor → broker `policy`", variant=LATENT_SEARCH, closed=True,
            fields=(Field("seq", "int", doc="incremented by one per step sent, echoed in "
                                            "`act`"),),
            arrays=_QUERY, constraints=(RowsPerTrue("obs", "root"),)),
        MessageSpec(
            wire.ACT, "The model's answers to a round of queries, in game order.",
            "broker → search actor", variant=LATENT_SEARCH,
            fields=(Field("seq", "int", doc="the step's `seq`"),),
            arrays=(Array("action", "int64", ("n",), rules=("action",),
                          doc="the policy's most likely action"),
                    Array("logits", "float32", ("n", "A"), rules=("bounded",),
                          doc="policy logits at the new node"),
                    Array("value", "float32", ("n",), rules=("bounded",),
                          doc="the value predicted at the new node"),
                    Array("reward", "float32", ("n",), rules=("bounded",),
                          doc="the reward the dynamics predicted for the action (0 at "
                              "a root)"))),
        MessageSpec(
            wire.INSERT, "Positions with their unroll targets (`muzero`).",
            "search actor → replay `experience`", variant=SEARCH_TARGETS, closed=True,
            fields=(Field("version", "int", False, "nonneg",
                          "parameter version searched with"),),
            arrays=(*_targets(),
                    Array("priority", "float32", ("B",), False, ("nonneg",),
                          "initial priorities: |search value - value target| at t")),
            constraints=(Together(BOOTSTRAP_ARRAYS),)),
        MessageSpec(wire.BATCH, "Sampled positions with their unroll targets.",
                    "replay → learner or reanalyse", variant=SEARCH_TARGETS,
                    fields=(REPLAY_SOURCE,), arrays=_targets(*BATCH_HEAD),
                    constraints=(Together(BOOTSTRAP_ARRAYS),)),
        MessageSpec(
            wire.REVISE, "Targets recomputed with newer parameters (MuZero Reanalyse); "
            "no reply on success.", "reanalyse → replay `sample`", variant=SEARCH_TARGETS,
            closed=True,
            fields=(Field("source", "str", doc="the `source` of the batch the keys came "
                                               "from (another incarnation's are skipped)"),),
            arrays=(Array("key", "int64", ("B",), doc="keys from a `batch`"),
                    Array("value", "float32", ("B", "K+1"), rules=("bounded",),
                          doc="new n-step value targets"),
                    Array("policy", "float32", ("B", "K+1", "A"), rules=("distribution",),
                          doc="new visit distributions"))),
    ),
)
