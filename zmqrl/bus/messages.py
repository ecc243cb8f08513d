"""Every message type declared once, as data: its fields, its arrays and their rules.

``wire.decode`` checks that a message is well formed (a msgpack header, arrays whose
bytes match their dtype and shape); this module checks that it *means* something: the
fields and arrays its type requires, with the right dtypes, the shapes a pattern over
the message's dimensions gives (``("T+1", "n", "*obs")``), and values inside their
rules (finite floats, actions inside the action space, discounts in [0, 1], ...).

A port builds one :class:`Context` when it starts (what it knows of the env and the
algorithm's dimensions) and calls :func:`check` on every message before it stores,
credits or trains on it; a violation raises ``wire.ProtocolError``, which the node
runtime turns into one log line and an ``error`` reply. The tables of
``docs/protocol.md`` are generated from the same declarations
(``python -m zmqrl.bus.messages``), and a test keeps the two in step.

Shape symbols bind on first use within a message and must agree afterwards; those the
context knows (``T``, ``L``, ``H``, ``*obs``, ``*action``) are bound before the check.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zmqrl.bus import roles, wire

# ----- the vocabulary ---------------------------------------------------------------
# Shape symbols: meaning and least value. Unknown symbols are a bug in a declaration.
SYMBOLS: dict[str, tuple[str, int]] = {
    "n": ("environments stepped together (one step message, one unroll's env columns)", 1),
    "T": ("unroll length, `algo.unroll`", 1),
    "B": ("items in an insert or batch", 1),
    "L": ("sequence length, `algo.sequence_length`", 1),
    "H": ("recurrent state size (LSTM units)", 1),
    "k": ("episodes reported", 0),
    "m": ("rows selected by a mask", 0),
    "A": ("actions of a discrete action space", 1),
    "S": ("bytes of a serialized state (`torch.save` of state dicts)", 1),
    "g": ("games reported", 1),
}
# "*obs" / "*action" stand for the env's observation / action shape (discrete: []).
STAR = ("*obs", "*action")

# Field types: how a msgpack value is recognised. bool is not an int here (msgpack
# keeps them apart, and True as a version would be a lie).
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "number": (int, float),
    "str": (str,),
    "bool": (bool,),
    "map": (dict,),
    "list": (list,),
}

# Value rules, for fields and arrays alike: the text that names them in docs and errors.
# A step's behaviour arguments (``args``): few, short names, bounded values.
MAX_BEHAVIOUR_ARGS, MAX_BEHAVIOUR_ARG = 32, 1e6
# Observations, rewards and what is computed from them must be finite *and* of bounded
# magnitude: a finite 3e38 overflows the first square in a loss. The bound is the
# topology's ``env.max_abs_value`` (default below), known to every port's Context.
DEFAULT_MAX_ABS_VALUE = 1e6
POLICY_SUM_TOLERANCE = 1e-3
RETURN_STEPS = 10**6  # an episode's return is bounded by max_abs_value over this many steps
RULES: dict[str, str] = {
    "finite": "finite (no NaN or inf)",
    "bounded": "finite (no NaN or inf) and of magnitude at most the env's "
               f"`max_abs_value` (default {DEFAULT_MAX_ABS_VALUE:g})",
    "return": "finite, of magnitude at most `max_abs_value` x 10^6 (a reward's bound "
              "summed over a million steps)",
    "sign": "in [-1, 1]",
    "distribution": f"in [0, 1], each row summing to 1 (within {POLICY_SUM_TOLERANCE:g})",
    "nonneg": "finite and >= 0",
    "positive": ">= 1",
    "count": "an int in [0, 2^31): what one message can count",
    "unit": "in [0, 1]",
    # discrete: ints in [0, A); Box: floats as "bounded" (a policy's unclipped samples
    # may fall outside the box, so its bounds are not the rule)
    "action": "inside the action space",
    "row": "a map from str to a number or str",
    "numbers": "a list of finite numbers",
    "names": "a list of at most 4096 names (strings of 1 to 64 characters)",
    "ratings": "a map of at most 4096 names (1 to 64 characters) to numbers within ±10000",
    "shows": f"at most {roles.MAX_SHOWN} names (of at most 64 characters) to "
             f"{' or '.join(f'`{p}`' for p in roles.POOLING)}",
    "behaviour_args": f"at most {MAX_BEHAVIOUR_ARGS} names (of at most 64 characters) to "
                      f"numbers within ±{MAX_BEHAVIOUR_ARG:g}",
}

# Array dtypes: concrete numpy names, or a symbol the context resolves.
DTYPE_SYMBOLS: dict[str, str] = {
    "obs": "the env's observation dtype (float32; uint8 for pixel envs)",
    "action": "the env's action dtype: int64 (discrete) or float32 (Box)",
    "float": "float16, float32 or float64",
}


@dataclass(frozen=True)
class Field:
    """A header field: ``type`` one of :data:`FIELD_TYPES`, ``rule`` one of :data:`RULES`."""

    name: str
    type: str
    required: bool = True
    rule: str | None = None
    doc: str = ""


@dataclass(frozen=True)
class Array:
    """An array: ``dtype`` a numpy name or one of :data:`DTYPE_SYMBOLS`; ``shape`` a
    tuple of ints, symbols of :data:`SYMBOLS` (optionally ``+1``) and :data:`STAR`."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    required: bool = True
    rules: tuple[str, ...] = ()
    doc: str = ""


@dataclass(frozen=True)
class Together:
    """These arrays come together or not at all."""

    names: tuple[str, ...]

    def describe(self) -> str:
        return " and ".join(f"`{n}`" for n in self.names) + " come together or not at all"


@dataclass(frozen=True)
class RowsPerTrue:
    """``rows`` has one row per true entry of the bool array ``mask``."""

    rows: str
    mask: str

    def describe(self) -> str:
        return f"`{self.rows}` has one row per true entry of `{self.mask}`, in order"


@dataclass(frozen=True)
class Implies:
    """Bool arrays of one shape: wherever ``a`` is true, ``b`` is true too."""

    a: str
    b: str

    def describe(self) -> str:
        return f"`{self.a}` implies `{self.b}` (elementwise)"


Constraint = Together | RowsPerTrue | Implies


@dataclass(frozen=True)
class Tensors:
    """Arrays named by the model rather than the protocol (``params``, ``grads``): one
    per tensor of the context's ``parameters`` (trainable) or ``state`` (state dict),
    exactly those names and shapes when the context knows them."""

    of: str  # "parameters" | "state"
    dtype: str = "float"
    rules: tuple[str, ...] = ("finite",)
    doc: str = ""


@dataclass(frozen=True)
class MessageSpec:
    """One message type (or one variant of it, where a type carries different arrays
    depending on the algorithm family)."""

    type: str
    doc: str
    direction: str = ""
    fields: tuple[Field, ...] = ()
    arrays: tuple[Array, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    variant: str = ""
    # closed: arrays other than those declared are rejected (a payload that must match
    # exactly, such as replay items); otherwise receivers ignore them (protocol §5).
    closed: bool = False
    tensors: Tensors | None = None

    @property
    def key(self) -> str:
        return f"{self.type}/{self.variant}" if self.variant else self.type


# ----- the declarations -------------------------------------------------------------
_EP_STATS = (
    Array("ep_return", "float32", ("k",), False, ("return",),
          "undiscounted returns of the episodes that ended since the sender's last message"),
    Array("ep_length", "int32", ("k",), False, ("nonneg",), "their lengths in env steps"),
)
_LABEL = Field("label", "str", doc="the sending node's label (`name` or `name.replica`)")


def _transitions(*extra: Array) -> tuple[Array, ...]:
    return (
        *extra,
        Array("obs", "obs", ("B", "*obs"), rules=("bounded",),
              doc="observation the action was chosen from"),
        Array("action", "action", ("B", "*action"), rules=("action",), doc="action taken"),
        Array("reward", "float32", ("B",), rules=("bounded",),
              doc="n-step return sum_{j<m} γ^j r_{t+j}, m <= n (m < n when the episode "
                  "ended sooner)"),
        Array("discount", "float32", ("B",), rules=("unit",),
              doc="γ^m to bootstrap from `next_obs`; 0 when the episode terminated"),
        Array("next_obs", "obs", ("B", "*obs"), rules=("bounded",),
              doc="observation m steps later (after a time-limit cut: the final one)"),
    )


def _sequences(*extra: Array) -> tuple[Array, ...]:
    return (
        *extra,
        Array("obs", "obs", ("B", "L+1", "*obs"), rules=("bounded",),
              doc="`obs[:, t]` is what `action[:, t]` was chosen from; `obs[:, L]` "
                  "bootstraps"),
        Array("action", "action", ("B", "L", "*action"), rules=("action",),
              doc="actions taken"),
        Array("reward", "float32", ("B", "L"), rules=("bounded",),
              doc="one-step rewards (a time-limit cut adds γ·h⁻¹(max_a Q(final obs, a)))"),
        Array("done", "bool", ("B", "L"), doc="`action[:, t]` ended its episode"),
        Array("state_h", "float32", ("B", "H"), rules=("bounded",),
              doc="LSTM state to use with `obs[:, 0]` (zero if it starts an episode)"),
        Array("state_c", "float32", ("B", "H"), rules=("bounded",), doc="(the cell state)"),
    )


def _positions(*extra: Array) -> tuple[Array, ...]:
    return (
        *extra,
        Array("obs", "obs", ("B", "*obs"), rules=("bounded",),
              doc="the position, seen by the player to move"),
        Array("policy", "float32", ("B", "A"), rules=("distribution",),
              doc="the search's visit distribution over the moves (sums to 1)"),
        Array("outcome", "float32", ("B",), rules=("sign",),
              doc="the game's final return for the player to move (+1 win, 0 draw, "
                  "-1 loss)"),
    )


_PRIORITY = Array("priority", "float32", ("B",), False, ("nonneg",),
                  "initial raw priorities (without: the largest seen so far)")
# What every ``batch`` variant starts with (a plug-in's item kinds too: its MessageSet
# builds its batch variant from this and REPLAY_SOURCE).
BATCH_HEAD = (
    Array("key", "int64", ("B",), doc="the items' keys, for `priorities`"),
    Array("weight", "float32", ("B",), rules=("unit",),
          doc="importance weights (1 without prioritized sampling)"),
)

_UNROLL_ARRAYS = (
    Array("obs", "obs", ("T+1", "n", "*obs"), rules=("bounded",),
          doc="`obs[t]` is what `action[t]` was chosen from; `obs[T]` bootstraps"),
    Array("action", "action", ("T", "n", "*action"), rules=("action",), doc="actions taken"),
    Array("logp", "float32", ("T", "n"), rules=("bounded",),
          doc="log-probability of `action[t]` under the behaviour policy"),
    Array("reward", "float32", ("T", "n"), rules=("bounded",),
          doc="reward `action[t]` earned (a time-limit cut includes the bootstrap)"),
    Array("done", "bool", ("T", "n"),
          doc="`action[t]` ended its episode; `obs[t+1]` then starts a new one"),
)
_INCARNATION = Field("incarnation", "str", False,
                     doc="the answering process's id: a new one means it restarted "
                         "(a producer recounts its credit, protocol §11)")
REPLAY_SOURCE = Field("source", "str", False,
                       doc="the replay's incarnation (its keys mean nothing to another)")
_PBT_MEMBER = Field("member", "int", rule="nonneg", doc="the member's index")
MAX_PLAYERS = 4096  # names in one `games` or `ratings` message
MAX_NAME = 64  # characters of a player's name
MAX_RATING = 10_000.0  # a rating's magnitude (a 400-point lead is 10:1 odds)
_PBT_HYPER = Field("hyperparameters", "map", doc="name → value (`algo` fields; `lr` also "
                                                  "sets the optimizer's)")
_VERSION = Field("version", "int", rule="nonneg",
                 doc="parameter version that chose the block's first action")

MESSAGES: tuple[MessageSpec, ...] = (
    MessageSpec(
        wire.HELLO, "I started: sent once, after the node's sockets are open.",
        "node → supervisor",
        fields=(_LABEL,
                Field("kind", "str", doc="node kind, or its `impl` string"),
                Field("role", "str", False, doc="what the run counts the node for "
                      "(`zmqrl/bus/roles.py`): `acts`, `serves`, `learns`, `applies`; "
                      "absent or empty: nothing"),
                Field("shows", "map", False, "shows",
                      "fields of its metrics rows for the run's progress line, each "
                      "pooled by `sum` or `last` (at most 8)"),
                Field("node", "str", doc="node name"),
                Field("replica", "int", rule="nonneg", doc="replica index"),
                Field("incarnation", "str", doc="random hex, new for every start"),
                Field("pid", "int", rule="positive", doc="process id"),
                Field("secret", "str", False,
                      doc="the `ZMQRL_NODE_SECRET` its supervisor put in its environment "
                          "(new for every start); without it the supervisor believes "
                          "none of the label's reports (§9)"))),
    MessageSpec(wire.HEARTBEAT, "Still alive: every 1 s.", "node → supervisor",
                fields=(_LABEL,)),
    MessageSpec(
        wire.METRICS, "One row of metrics, every metrics interval (1-2 s).",
        "node → supervisor",
        fields=(_LABEL,
                Field("row", "map", rule="row",
                      doc="the row appended to `metrics/<label>.csv` (always `time_s`, "
                          "`bad_messages`, `dropped`, `cpu_cores`)"),
                Field("episodes", "list", rule="numbers",
                      doc="returns of the episodes that finished since the last report "
                          "(the newest, at most 10,000)"),
                Field("episodes_more", "int", False, "nonneg",
                      doc="episodes that finished besides those in `episodes`"))),
    MessageSpec(wire.PING, "Liveness request; any ROUTER port answers `pong`.",
                "anyone → any ROUTER port",
                fields=(Field("seq", "int", False, doc="echoed in the `pong`"),)),
    MessageSpec(wire.PONG, "Answer to `ping`.", "ROUTER port → pinger",
                fields=(Field("node", "str", doc="label of the answering replica"),
                        _INCARNATION,
                        Field("seq", "int", False, doc="the ping's `seq`, if it had one"))),
    MessageSpec(wire.DESCRIBE, "What does this port take? Any ROUTER port answers "
                "`description`.", "anyone → any ROUTER port"),
    MessageSpec(
        wire.DESCRIPTION, "Answer to `describe`: enough to write a client of the port.",
        "ROUTER port → asker",
        fields=(Field("protocol", "int", doc="protocol version (`v`)"),
                Field("node", "str", doc="label of the answering replica"),
                Field("kind", "str", False, doc="node kind (or `impl`)"),
                Field("port", "str", doc="the port asked"),
                Field("accepts", "list", doc="message types the port takes"),
                Field("env", "str", False, doc="gymnasium id of the topology's env"),
                Field("obs_shape", "list", False, doc="observation shape"),
                Field("obs_dtype", "str", False, doc="observation dtype"),
                Field("action_dtype", "str", False, doc="action dtype"),
                Field("action_space", "map", False,
                      doc="`{kind: discrete, n}` or `{kind: box, shape, low, high}`"))),
    MessageSpec(
        wire.STEP, "Observations of `n` envs, and the outcome of their previous actions.",
        "actor → broker `policy`",
        fields=(Field("seq", "int", doc="incremented by one per step sent (zmqrl starts "
                                        "at 1), echoed in `act`"),
                Field("epsilon", "number", False, "unit",
                      "this actor's exploration rate (behaviours that explore by ε)"),
                Field("args", "map", False, "behaviour_args",
                      "this actor's behaviour arguments: names to finite numbers "
                      "(at most 32)")),
        arrays=(
            Array("obs", "obs", ("n", "*obs"), rules=("bounded",),
                  doc="current observation of each env"),
            Array("reward", "float32", ("n",), rules=("bounded",),
                  doc="reward the previous action of each env earned"),
            Array("done", "bool", ("n",),
                  doc="that action ended its episode (terminated or truncated)"),
            Array("truncated", "bool", ("n",), False,
                  doc="the subset of `done` cut by a time limit (terminated and truncated "
                      "at once: sent as terminated, `truncated` false)"),
            Array("final_obs", "obs", ("m", "*obs"), False, ("bounded",),
                  "final observation of each truncated env, in env order"),
            *_EP_STATS),
        constraints=(Together(("ep_return", "ep_length")),
                     Together(("truncated", "final_obs")),
                     RowsPerTrue("final_obs", "truncated"), Implies("truncated", "done"))),
    MessageSpec(
        wire.ACT, "Actions for the envs of a step.", "broker → actor",
        fields=(Field("seq", "int", doc="the step's `seq`"),),
        arrays=(Array("action", "action", ("n", "*action"), rules=("action",),
                      doc="row `i` is the action for env `i`"),)),
    MessageSpec(
        wire.ACT, "A network's evaluation of the leaves a search sent as a `step` (its "
        "`obs`; rewards and dones zero: a leaf has no outcome).", "broker → search actor",
        variant="evaluation",
        fields=(Field("seq", "int", doc="the step's `seq`"),),
        arrays=(Array("action", "action", ("n", "*action"), rules=("action",),
                      doc="the network's most likely move (what any actor could play)"),
                Array("logits", "float32", ("n", "A"), rules=("bounded",),
                      doc="policy logits over every move (the searcher masks the "
                          "illegal ones)"),
                Array("value", "float32", ("n",), rules=("sign",),
                      doc="the value of the leaf for the player to move, in [-1, 1]"))),
    MessageSpec(
        wire.UNROLL, "A time-major block of `T` transitions of `n` envs.",
        "broker or local-policy actor → learner `experience`",
        fields=(_VERSION,), arrays=(*_UNROLL_ARRAYS, *_EP_STATS),
        constraints=(Together(("ep_return", "ep_length")),)),
    MessageSpec(
        wire.UNROLL, "The same, from a recurrent actor-critic (`lstm_ac`).",
        "broker or local-policy actor → learner `experience`", variant="recurrent",
        fields=(_VERSION,),
        arrays=(*_UNROLL_ARRAYS,
                Array("state_h", "float32", (1, "n", "H"), rules=("bounded",),
                      doc="LSTM state used with `obs[0]` (zero where it starts an episode)"),
                Array("state_c", "float32", (1, "n", "H"), rules=("bounded",),
                      doc="(the cell state)"),
                *_EP_STATS),
        constraints=(Together(("ep_return", "ep_length")),)),
    MessageSpec(
        wire.INSERT, "n-step transitions for a replay (`dqn`; `td3` and `sac` with float "
                     "actions).",
        "actor or broker → replay `experience`", variant="transitions", closed=True,
        fields=(Field("version", "int", False, "nonneg", "parameter version acted with"),),
        arrays=(*_transitions(), _PRIORITY)),
    MessageSpec(
        wire.INSERT, "Fixed-length sequences with their start state (`r2d2`).",
        "actor or broker → replay `experience`", variant="sequences", closed=True,
        fields=(Field("version", "int", False, "nonneg", "parameter version acted with"),),
        arrays=(*_sequences(), _PRIORITY)),
    MessageSpec(
        wire.INSERT, "Positions of finished self-play games (`alphazero`).",
        "search actor → replay `experience`", variant="positions", closed=True,
        fields=(Field("version", "int", False, "nonneg", "parameter version searched with"),),
        arrays=(*_positions(), _PRIORITY)),
    MessageSpec(
        wire.SAMPLE, "Ask for a batch; the reply may come much later.",
        "learner → replay `sample`",
        fields=(Field("batch_size", "int", rule="positive",
                      doc="items wanted (at most the replay's capacity)"),
                Field("client", "str", False,
                      doc="the asking process; its requests from older connections are "
                          "dropped"),
                Field("revise", "bool", False,
                      doc="true: a reviser's peek (a reanalyse node), answered at once "
                          "with items drawn uniformly, outside the rate limiter and "
                          "every counter; only for a node the topology links as a "
                          "reviser (at most its `batch_size`; a `command:` node's "
                          "`args.revise_batch`), one per connection until its `revise`; "
                          "`error` with `retry` while fewer are held or "
                          "`revisions_per_insert` is reached"))),
    MessageSpec(wire.BATCH, "Sampled transitions.", "replay → learner",
                variant="transitions", fields=(REPLAY_SOURCE,),
                arrays=_transitions(*BATCH_HEAD)),
    MessageSpec(wire.BATCH, "Sampled sequences.", "replay → learner",
                variant="sequences", fields=(REPLAY_SOURCE,),
                arrays=_sequences(*BATCH_HEAD)),
    MessageSpec(wire.BATCH, "Sampled positions.", "replay → learner",
                variant="positions", fields=(REPLAY_SOURCE,),
                arrays=_positions(*BATCH_HEAD)),
    MessageSpec(
        wire.PRIORITIES, "New priorities for sampled items, sent on the connection the "
        "`batch` came on: a replay applies them only to keys it sent to that connection "
        "(others are skipped and counted); no reply.",
        "learner → replay `sample`",
        fields=(Field("source", "str", False,
                      doc="the `source` of the batch the keys came from: priorities for "
                          "another replay incarnation's keys are skipped, not applied"),),
        arrays=(Array("key", "int64", ("m",), doc="keys from `batch` messages"),
                Array("priority", "float32", ("m",), rules=("nonneg",),
                      doc="new raw priorities"))),
    MessageSpec(
        wire.GRADS, "Gradients of the loss; the reply is `params`.",
        "A3C actor or Gorila learner → parameter server `grads`",
        fields=(Field("version", "int", False, "nonneg", "informational"),
                Field("env_steps", "int", False, "count",
                      "env steps the gradients came from")),
        tensors=Tensors("parameters", doc="one per trainable parameter, named as in "
                                          "`named_parameters()`, with its exact shape")),
    MessageSpec(wire.GET_PARAMS, "Ask for the current parameters.",
                "anyone → parameter server `grads`"),
    MessageSpec(
        wire.PARAMS, "A complete snapshot of the model.",
        "learner or parameter server → subscribers, or reply to `grads`/`get_params`",
        fields=(Field("version", "int", rule="nonneg",
                      doc="optimizer updates behind these parameters (0: the initial ones)"),
                Field("source", "str", False, doc="id of the publishing process")),
        tensors=Tensors("state", doc="one per `state_dict` entry, named by its key, with "
                                     "the tensor's shape")),
    MessageSpec(wire.CREDIT, "Grant for more experience messages.",
                "consumer's `experience` port → producer",
                fields=(Field("n", "int", rule="positive", doc="messages granted"),
                        Field("node", "str", False, doc="label of the granting replica"),
                        _INCARNATION)),
    MessageSpec(wire.ERROR, "Reply to a rejected message.", "ROUTER port → sender",
                fields=(Field("error", "str", doc="why, for humans"),
                        Field("retry", "bool", required=False,
                              doc="true: the request was dropped unjudged (a queue "
                                  "bound), not refused; asking again is right"))),
    # Population-based training (nodes/pbt.py, zmqrl/parts/learning/pbt_member.py)
    MessageSpec(
        wire.PBT_REPORT, "A member's progress, every second.", "member learner → pbt `members`",
        fields=(_PBT_MEMBER, Field("steps", "int", rule="nonneg", doc="env steps trained on"),
                Field("mean_return", "number", False, "finite",
                      "mean return of its latest episodes since its last load: 20, or "
                      "the population's `ranked_episodes` (absent or nil: none yet)"),
                Field("return_std", "number", False, "nonneg",
                      "the sample standard deviation of those returns (with `episodes`: "
                      "what `min_donor_confidence` tests; absent: not tested)"),
                Field("episodes", "int", False, "nonneg", "how many returns the mean is of"),
                _PBT_HYPER,
                Field("checkpointed", "bool", doc="it has a checkpoint on disk (only such "
                                                  "members are copied)"),
                Field("updates", "int", False, "nonneg", "its update count"))),
    MessageSpec(wire.PBT_GET_STATE, "Ask a donor for its state; the reply is `pbt_state`, or "
                "`error` (with `request`) when the state is over `network.max_message_bytes`.",
                "pbt → donor learner `pbt`",
                fields=(Field("request", "int", rule="nonneg", doc="the recipient's index"),)),
    MessageSpec(
        wire.PBT_STATE, "A donor's weights and optimizer state.", "donor learner → pbt",
        fields=(_PBT_MEMBER, Field("request", "int", rule="nonneg", doc="echoed"), _PBT_HYPER,
                Field("updates", "int", rule="nonneg", doc="its update count")),
        arrays=(Array("state", "uint8", ("S",), doc="`torch.save` of `{model, algo, "
                                                   "updates}` state dicts"),)),
    MessageSpec(
        wire.PBT_LOAD, "Load a donor's state, then take new hyperparameters; reply "
        "`pbt_loaded`, or `error` (with `request`) when the state or a hyperparameter is "
        "refused: all is checked before anything is loaded.", "pbt → recipient learner `pbt`",
        fields=(Field("request", "int", rule="nonneg", doc="the recipient's index"),
                Field("donor", "int", rule="nonneg", doc="the donor's index"), _PBT_HYPER),
        arrays=(Array("state", "uint8", ("S",), doc="the donor's `pbt_state`"),)),
    MessageSpec(
        wire.PBT_LOADED, "The recipient loaded the donor's state and hyperparameters, "
        "published its parameters under a new version and checkpointed.",
        "recipient learner → pbt",
        fields=(_PBT_MEMBER, Field("request", "int", rule="nonneg", doc="echoed"),
                Field("donor", "int", rule="nonneg", doc="whose state it loaded"),
                Field("donor_updates", "int", rule="nonneg",
                      doc="the donor's update count in that state"), _PBT_HYPER)),
    # A population's games and ratings (nodes/population_broker.py, nodes/population_league.py)
    MessageSpec(
        wire.GAMES, "Finished games, for the ratings: game `i` was `players[first[i]]` "
        "(seat 0) against `players[second[i]]` (seat 1), and seat 0 scored `score[i]` "
        "(1 win, 0.5 draw, 0 loss). Not answered (a lost batch loses those games' ratings "
        "updates, nothing else).", "broker → league `games`",
        fields=(Field("players", "list", rule="names",
                      doc="the names the indices refer to (`first`, `second` < its length)"),
                Field("source", "str", False, doc="the sender's label")),
        arrays=(Array("first", "int32", ("g",), rules=("nonneg",), doc="seat 0's index"),
                Array("second", "int32", ("g",), rules=("nonneg",), doc="seat 1's index"),
                Array("score", "float32", ("g",), rules=("unit",), doc="seat 0's score"))),
    MessageSpec(
        wire.RATINGS, "Every rated player's Elo, about once a second.",
        "league `ratings` → subscribers (brokers' matchmaking, pbt's ranking)",
        fields=(Field("ratings", "map", rule="ratings", doc="player name → Elo"),
                Field("games", "int", rule="nonneg", doc="games rated so far"),
                Field("source", "str", False, doc="the league's incarnation"))),
    MessageSpec(
        wire.EXPLOITED, "A PBT exploit is done: member `recipient` now plays with member "
        "`donor`'s weights, so the league gives it the donor's rating (rather than let "
        "games move it there). Not answered.", "pbt → league `games`",
        fields=(Field("recipient", "int", rule="nonneg", doc="the member that copied (player "
                                                             "`m<recipient>`)"),
                Field("donor", "int", rule="nonneg", doc="the member copied"),
                Field("source", "str", False, doc="the sender's label"))),
)

SPECS: dict[str, MessageSpec] = {s.key: s for s in MESSAGES}
if len(SPECS) != len(MESSAGES) or not {s.type for s in MESSAGES} <= wire.MESSAGE_TYPES:
    raise RuntimeError("messages: duplicate or unknown message declarations")


# ----- declarations a plug-in adds ----------------------------------------------------
@dataclass(frozen=True)
class MessageSet:
    """Message declarations an algorithm adds to the protocol: new variants of the wire's
    types (its replay items as ``insert``/``batch`` variants, its acting as ``step``/
    ``act`` variants) and the shape symbols they use. Registered like any part, as an
    entry point of the ``zmqrl.messages`` group naming a module-level ``MessageSet``
    (:mod:`zmqrl.plugins`); zmqrl's own algorithms beyond the core register theirs the
    same way (MuZero's: ``zmqrl.parts.muzero.messages``)."""

    messages: tuple[MessageSpec, ...]
    symbols: dict[str, tuple[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A set's shape symbols are its own (a namespace): its messages are checked
        # with them, another set may give the same letter another meaning.
        for s in self.messages:
            _SET_SYMBOLS[id(s)] = self.symbols


# id of a set's MessageSpec -> that set's symbols (specs are module-level constants)
_SET_SYMBOLS: dict[int, dict[str, tuple[str, int]]] = {}
# The sets this process loads: None (no topology loaded: every registered set, as the
# protocol document wants) or the union of those its topologies' algorithms name.
_IN_USE: set[str] | None = None


def symbols_of(spec: MessageSpec) -> dict[str, tuple[str, int]]:
    """The shape symbols ``spec`` is checked with: the core's and its own set's."""
    own = _SET_SYMBOLS.get(id(spec))
    return {**SYMBOLS, **own} if own else SYMBOLS


def use(names: Iterable[str]) -> None:
    """This process runs a topology whose parts need the message sets ``names``
    (``AlgoConfig.messages``): load those, and no other registered set. Called when a
    topology loads (``zmqrl.run.topology``); the union over every topology loaded."""
    global _IN_USE
    names = set(names)
    if _IN_USE is None or not names <= _IN_USE:
        _IN_USE = (_IN_USE or set()) | names
        registered.cache_clear()


@functools.cache
def registered(every: bool = False) -> dict[str, MessageSpec]:
    """Every declaration in use: the core's (:data:`MESSAGES`) and each
    :class:`MessageSet`'s that this process's topology names (:func:`use`; before any
    topology loads, or with ``every``, each registered set), by key (``type/variant``).
    A set that
    redeclares a key or a core shape symbol, or declares a type the wire does not carry,
    is an error naming it; a set nobody uses is never imported, so a broken plug-in
    breaks only the topologies that name it."""
    from zmqrl import plugins  # (zmqrl.plugins imports nothing of the bus)

    found = dict(SPECS)
    names = plugins.names("messages") if every or _IN_USE is None else sorted(_IN_USE)
    for name in names:
        extra = plugins.resolve("messages", name)
        if not isinstance(extra, MessageSet):
            raise plugins.PluginError(f"messages '{name}' is not a MessageSet")
        for sym, meaning in extra.symbols.items():
            if SYMBOLS.get(sym, meaning) != meaning:
                raise plugins.PluginError(f"messages '{name}': shape symbol {sym!r} is "
                                          f"already declared as {SYMBOLS[sym][0]!r}")
        for s in extra.messages:
            if s.type not in wire.MESSAGE_TYPES:
                raise plugins.PluginError(f"messages '{name}': {s.type!r} is not a wire "
                                          "message type")
            if found.setdefault(s.key, s) is not s:
                raise plugins.PluginError(f"messages '{name}': {s.key!r} is declared twice")
    return found


def spec(msg_type: str, variant: str = "") -> MessageSpec:
    """The declaration of ``msg_type`` (and ``variant``, e.g. ``insert``/``sequences``),
    the core's or a message set's in use; KeyError naming what is known."""
    key = f"{msg_type}/{variant}" if variant else msg_type
    core = SPECS.get(key)
    if core is not None:
        return core  # (no set loaded for the core's own messages)
    known = registered()
    if key not in known and _IN_USE is not None:
        # not among the sets the topology names (a tool, or a test, asking outside one)
        known = registered(every=True)
    if key not in known:
        variants = sorted(k.partition("/")[2] for k in known if k.startswith(f"{msg_type}/"))
        raise KeyError(f"no message '{key}' is declared (variants of '{msg_type}': "
                       f"{', '.join(variants) or 'none'}; a plug-in declares its own in "
                       "the zmqrl.messages group, and its algorithm config names that "
                       "set in `messages`)")
    return known[key]


# ----- the context a port checks against --------------------------------------------
@dataclass
class Context:
    """What a port knows: env shapes and dtypes, the algorithm's dimensions, the model's
    tensors. Anything left ``None`` binds freely from the first message array using it."""

    obs_shape: tuple[int, ...] | None = None
    obs_dtype: str = "float32"
    action_shape: tuple[int, ...] | None = None
    action_dtype: str | None = None  # None: int64 or float32
    num_actions: int | None = None  # discrete action count; None: Box (or unknown)
    dims: dict[str, int] = field(default_factory=dict)  # pre-bound symbols: T, L, H, K
    # optional arrays the run's configuration sends (True: required) or never sends
    # (False: refused); AlgoConfig.optional_arrays
    arrays: dict[str, bool] = field(default_factory=dict)
    parameters: dict[str, tuple[int, ...]] | None = None  # trainable: what grads name
    state: dict[str, tuple[int, ...]] | None = None  # state dict: what params carry
    # the largest magnitude of an observation, reward or action ("bounded")
    max_abs: float = DEFAULT_MAX_ABS_VALUE
    _compiled: dict[int, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_env(cls, env: Any, *, unroll: int | None = None,
                 sequence_length: int | None = None, state_size: int = 0,
                 model: Any = None, algo: Any = None) -> Context:
        """From a ``zmqrl.parts.envs.EnvSpec`` and whatever dimensions the port knows;
        ``model`` (a torch module) fixes the tensors of ``grads`` and ``params``, ``algo``
        (the run's algorithm config) the symbols and optional arrays its
        hyperparameters fix (``AlgoConfig.message_dims``, ``optional_arrays``)."""
        dims = {k: v for k, v in (("T", unroll), ("L", sequence_length),
                                  ("H", state_size or None)) if v}
        arrays: dict[str, bool] = {}
        if algo is not None:
            dims.update(getattr(algo, "message_dims", dict)())
            arrays.update(getattr(algo, "optional_arrays", dict)())
        ctx = cls(tuple(env.obs_shape), np.dtype(env.obs_dtype).name, tuple(env.action_shape),
                  np.dtype(env.action_dtype).name, env.num_actions, dims, arrays,
                  max_abs=float(getattr(env, "max_abs", DEFAULT_MAX_ABS_VALUE)))
        if model is not None:
            ctx.parameters = {k: tuple(p.shape) for k, p in model.named_parameters()
                              if p.requires_grad}
            ctx.state = {k: tuple(t.shape) for k, t in model.state_dict().items()}
        return ctx


def check(msg: wire.Message, spec: MessageSpec, ctx: Context) -> dict[str, int]:
    """Check ``msg`` against ``spec`` in ``ctx``; return the bound dimensions (``n``,
    ``T``, ...). Raise ``wire.ProtocolError`` naming the message, the field or array
    and what was expected."""
    checker = ctx._compiled.get(id(spec))
    if checker is None:
        checker = ctx._compiled[id(spec)] = _Checker(spec, ctx)
    return checker(msg)


# ----- the checker: everything per spec and context precomputed once ----------------
_FLOATS = ("float16", "float32", "float64")


def _abs_max_at_most(a: np.ndarray, limit: float) -> bool:
    """Every entry's magnitude at most ``limit``; a NaN fails the comparison. (As fast as
    the plain finiteness check on a step's arrays: ~1.2 us at 128 entries.)"""
    return bool(np.maximum.reduce(np.abs(a), axis=None) <= limit)


def _name_ok(name: Any) -> bool:
    return type(name) is str and 0 < len(name) <= MAX_NAME


def _rule_ok(rule: str, value: Any) -> bool:
    """Field rules (scalars and small containers)."""
    if rule == "finite":
        return math.isfinite(value)
    if rule == "nonneg":
        return math.isfinite(value) and value >= 0
    if rule == "positive":
        return value >= 1
    if rule == "count":
        return 0 <= value < 2**31
    if rule == "unit":
        return 0 <= value <= 1  # NaN compares false
    if rule == "row":
        return all(type(k) is str and (v is None or type(v) in (int, float, str, bool))
                   for k, v in value.items())
    if rule == "numbers":
        return all(type(v) in (int, float) and math.isfinite(v) for v in value)
    if rule == "names":
        return len(value) <= MAX_PLAYERS and all(_name_ok(v) for v in value)
    if rule == "ratings":
        return len(value) <= MAX_PLAYERS and all(
            _name_ok(k) and type(v) in (int, float) and abs(v) <= MAX_RATING  # NaN fails
            for k, v in value.items())
    if rule == "shows":
        return len(value) <= roles.MAX_SHOWN and all(
            type(k) is str and len(k) <= 64 and v in roles.POOLING for k, v in value.items())
    if rule == "behaviour_args":
        return len(value) <= MAX_BEHAVIOUR_ARGS and all(
            type(k) is str and len(k) <= 64 and type(v) in (int, float)
            and abs(v) <= MAX_BEHAVIOUR_ARG for k, v in value.items())  # NaN fails
    raise ValueError(f"unknown field rule {rule!r}")


def _dtype_text(dtypes: frozenset[np.dtype]) -> str:
    return " or ".join(sorted(d.name for d in dtypes))


class _Checker:
    def __init__(self, spec: MessageSpec, ctx: Context):
        self.spec = spec
        self.t = spec.type
        self.dims = dict(ctx.dims)
        if ctx.num_actions is not None and any("A" in a.shape for a in spec.arrays):
            self.dims["A"] = ctx.num_actions  # a discrete space's size, where one is used
        self.fields = [(f.name, FIELD_TYPES[f.type], f.type, f.required, f.rule)
                       for f in spec.fields]
        self.symbols = symbols_of(spec)
        self.arrays = [self._compile_array(a, ctx) for a in spec.arrays]
        self.names = frozenset(a.name for a in spec.arrays)
        # optional arrays the run's configuration never sends
        self.refused = frozenset(a.name for a in spec.arrays
                                 if not a.required and ctx.arrays.get(a.name) is False)
        self.configured = frozenset(a.name for a in spec.arrays  # ... or always sends
                                    if not a.required and ctx.arrays.get(a.name) is True)
        self.closed = spec.closed
        self.together = [c.names for c in spec.constraints if isinstance(c, Together)]
        self.value_constraints = [c for c in spec.constraints if not isinstance(c, Together)]
        self.tensors = None
        if spec.tensors is not None:
            t = spec.tensors
            shapes = getattr(ctx, t.of)
            dtypes = self._dtypes(t.dtype, ctx)
            self.tensors = (shapes, dtypes, [self._rule(r, ctx) for r in t.rules], t.rules,
                            _dtype_text(dtypes))

    # -- compilation
    @staticmethod
    def _dtypes(dtype: str, ctx: Context) -> frozenset[np.dtype]:
        if dtype == "obs":
            names: tuple[str, ...] = (ctx.obs_dtype,)
        elif dtype == "action":
            names = (ctx.action_dtype,) if ctx.action_dtype else ("int64", "float32")
        elif dtype == "float":
            names = _FLOATS
        else:
            names = (dtype,)
        return frozenset(np.dtype(n) for n in names)

    def _rule(self, rule: str, ctx: Context) -> Any:
        if rule == "finite":
            return lambda a: a.dtype.kind != "f" or np.isfinite(a).all()
        limit = ctx.max_abs
        if rule == "bounded":  # bool/uint8 arrays (pixels) are small by their dtype
            return lambda a: a.dtype.kind in "bu" or _abs_max_at_most(a, limit)
        if rule == "return":
            most = limit * RETURN_STEPS
            return lambda a: _abs_max_at_most(a, most)
        if rule == "sign":
            return lambda a: bool(((a >= -1) & (a <= 1)).all())
        if rule == "distribution":
            return lambda a: bool(((a >= 0) & (a <= 1)).all()) and bool(
                (np.abs(a.sum(axis=-1, dtype=np.float64) - 1) <= POLICY_SUM_TOLERANCE).all())
        if rule == "nonneg":
            return lambda a: bool(((a >= 0) & (a < np.inf)).all()) if a.dtype.kind == "f" \
                else bool((a >= 0).all())
        if rule == "unit":
            return lambda a: bool(((a >= 0) & (a <= 1)).all())
        if rule == "action":
            num = ctx.num_actions

            def action_ok(a: np.ndarray) -> bool:
                if a.dtype.kind == "f":
                    return _abs_max_at_most(a, limit)
                if num is None or a.dtype.kind not in "iu":  # unknown space: any ints >= 0
                    return a.dtype.kind == "u" or bool((a >= 0).all())
                # negatives viewed as unsigned are huge: one comparison checks both ends
                unsigned = a.view(f"u{a.dtype.itemsize}") if a.dtype.kind == "i" else a
                return bool((unsigned < num).all())
            return action_ok
        raise ValueError(f"unknown array rule {rule!r}")

    def _compile_array(self, a: Array, ctx: Context) -> tuple:
        # (symbol, offset, least) or (None, size, 0)
        tokens: list[tuple[str | None, int, int]] = []
        star = None
        for part in a.shape:
            if isinstance(part, int):
                tokens.append((None, part, 0))
            elif part in STAR:
                known = ctx.obs_shape if part == "*obs" else ctx.action_shape
                if known is None:
                    star = part  # binds the remaining dimensions, whatever they are
                else:
                    tokens.extend((None, d, 0) for d in known)
            else:
                sym, _, off = part.partition("+")
                if sym not in self.symbols:
                    raise ValueError(f"{a.name}: unknown shape symbol {part!r}")
                tokens.append((sym, int(off or 0), self.symbols[sym][1]))
        dtypes = self._dtypes(a.dtype, ctx)
        rules = [self._rule(r, ctx) for r in a.rules]
        # an optional array the run's configuration sends is required of every peer
        required = a.required or ctx.arrays.get(a.name) is True
        return (a.name, required, dtypes, tokens, star, rules, a.rules, _dtype_text(dtypes))

    # -- errors
    def _pattern(self, tokens: list, star: str | None, bound: dict) -> str:
        parts = []
        for sym, off, _ in tokens:
            if sym is None:
                parts.append(str(off))
            elif sym in bound:
                parts.append(str(bound[sym] + off))
            else:
                parts.append(f"{sym}+{off}" if off else sym)
        if star is not None:
            parts.append(star if star not in bound else ", ".join(map(str, bound[star])))
        return "[" + ", ".join(p for p in parts if p) + "]"

    def _fail(self, text: str) -> None:
        raise wire.ProtocolError(f"{self.t} {text}")

    # -- the check
    def __call__(self, msg: wire.Message) -> dict[str, Any]:
        if msg.type != self.t:
            raise wire.ProtocolError(f"expected '{self.t}', got '{msg.type}'")
        arrays = msg.arrays
        if self.closed and not arrays.keys() <= self.names:
            extra = sorted(arrays.keys() - self.names)
            self._fail(f"has unexpected array '{extra[0]}' (takes only "
                       f"{', '.join(sorted(self.names))})")
        for names in self.together:
            present = [n in arrays for n in names]
            if any(present) and not all(present):
                self._fail(": " + " and ".join(f"'{n}'" for n in names)
                           + " must come together")
        bound: dict[str, Any] = dict(self.dims)
        for name, required, dtypes, tokens, star, rules, rule_names, dtype_text in self.arrays:
            arr = arrays.get(name)
            if arr is None:
                if required:
                    why = " (its algorithm's configuration sends it in this run)" \
                        if name in self.configured else ""
                    self._fail(f"needs '{name}' of shape {self._pattern(tokens, star, bound)} "
                               f"({dtype_text}), got none{why}")
                continue
            if name in self.refused:
                self._fail(f": '{name}' is not sent in this run (its algorithm's "
                           "configuration leaves it out)")
            if arr.dtype not in dtypes:
                self._fail(f"'{name}' must be {dtype_text}, got {arr.dtype}")
            shape = arr.shape
            if not self._match(shape, tokens, star, bound):
                self._fail(f"needs '{name}' of shape {self._pattern(tokens, star, bound)}"
                           f"{self._least(shape, tokens)}, got {shape}")
            if arr.size:
                for ok, rule in zip(rules, rule_names, strict=True):
                    if not ok(arr):
                        self._fail(f"'{name}' must be {RULES[rule]}")
        for c in self.value_constraints:
            self._constraint(c, arrays)
        if self.tensors is not None:
            self._check_tensors(arrays)
        # Fields after arrays: a message wrong in both is told about its data first.
        fields = msg.fields
        for name, types, tname, required, rule in self.fields:
            value = fields.get(name)
            if value is None:
                if required:
                    self._fail(f"needs field '{name}' ({tname})")
                continue
            if type(value) not in types:
                self._fail(f"field '{name}' must be {tname}, got {value!r:.40}")
            if rule is not None and not _rule_ok(rule, value):
                self._fail(f"field '{name}' must be {RULES[rule]}, got {value!r:.40}")
        return bound

    @staticmethod
    def _match(shape: tuple, tokens: list, star: str | None, bound: dict) -> bool:
        """Whether ``shape`` fits; binds the new symbols into ``bound`` only if it does."""
        ndim = len(tokens)
        if len(shape) != ndim if star is None else len(shape) < ndim:
            return False
        new = None
        for i in range(ndim):
            sym, off, least = tokens[i]
            size = shape[i]
            if sym is None:
                if size != off:
                    return False
                continue
            have = bound.get(sym)
            if have is None and new is not None:
                have = new.get(sym)
            if have is None:
                if size - off < least:
                    return False
                if new is None:
                    new = {}
                new[sym] = size - off
            elif size != have + off:
                return False
        if star is not None:
            rest = shape[ndim:]
            have = bound.get(star)
            if have is not None and rest != have:
                return False
            bound[star] = rest
        if new:
            bound.update(new)
        return True

    @staticmethod
    def _least(shape: tuple, tokens: list) -> str:
        """Say so when a dimension is below its symbol's least value (n >= 1)."""
        for (sym, off, least), size in zip(tokens, shape, strict=False):
            if sym is not None and size - off < least:
                return f" with {sym} >= {least}"
        return ""

    def _constraint(self, c: Constraint, arrays: dict) -> None:
        if isinstance(c, RowsPerTrue):
            rows, mask = arrays.get(c.rows), arrays.get(c.mask)
            if rows is not None and mask is not None:
                want = int(np.count_nonzero(mask))
                if rows.shape[0] != want:
                    self._fail(f"'{c.rows}' needs one row per true entry of '{c.mask}' "
                               f"({want}), got {rows.shape[0]}")
        elif isinstance(c, Implies):
            a, b = arrays.get(c.a), arrays.get(c.b)
            if a is not None and b is not None and a.shape == b.shape and (a & ~b).any():
                self._fail(f"'{c.a}' implies '{c.b}': entry "
                           f"{int(np.flatnonzero(a & ~b)[0])} is {c.a} but not {c.b}")

    def _check_tensors(self, arrays: dict) -> None:
        shapes, dtypes, rules, rule_names, dtype_text = self.tensors
        if shapes is not None and arrays.keys() != shapes.keys():
            missing = sorted(shapes.keys() - arrays.keys())
            extra = sorted(arrays.keys() - shapes.keys())
            self._fail(f"must carry exactly the model's tensors: "
                       f"{'missing ' + repr(missing[0]) if missing else ''}"
                       f"{', ' if missing and extra else ''}"
                       f"{'unexpected ' + repr(extra[0]) if extra else ''}")
        for name, arr in arrays.items():
            if arr.dtype not in dtypes:
                self._fail(f"'{name}' must be {dtype_text}, got {arr.dtype}")
            if shapes is not None and arr.shape != shapes[name]:
                self._fail(f"needs '{name}' of shape {list(shapes[name])}, got {arr.shape}")
            for ok, rule in zip(rules, rule_names, strict=True):
                if arr.size and not ok(arr):
                    self._fail(f"'{name}' must be {RULES[rule]}")


# ----- the protocol document's tables -------------------------------------------------
def _shape_text(shape: tuple) -> str:
    return "`[" + ", ".join(str(p) for p in shape) + "]`"


def markdown() -> str:
    """The tables of docs/protocol.md §5, generated from every registered declaration
    (:func:`registered`: the core's, then the plug-ins')."""
    specs = registered(every=True)
    own = {sym: meaning for s in specs.values() for sym, meaning in
           _SET_SYMBOLS.get(id(s), {}).items()}  # (a letter two sets use: listed once)
    out = ["Shape symbols bind on first use within a message and must agree afterwards: "
           + "; ".join(f"`{s}` {text} (≥ {least})" for s, (text, least) in SYMBOLS.items())
           + "".join(f"; `{s}` {text} (≥ {least}) in its message set's messages"
                     for s, (text, least) in own.items())
           + ". `*obs` and `*action` stand for the env's observation and action shapes "
           "(`[]` for a discrete action). A symbol that names a hyperparameter "
           "(`T`, `L`, `K`) is bound by the run's configuration before any message: a "
           "receiving port refuses another value, whoever sends it first; so is an "
           "optional array the configuration always sends (required) or never sends "
           "(refused), such as MuZero's reanalyse arrays with `algo.reanalyse`. "
           "Dtype `obs` is "
           f"{DTYPE_SYMBOLS['obs']}, `action` {DTYPE_SYMBOLS['action']}, "
           f"`float` {DTYPE_SYMBOLS['float']}.", "",
           "Rules: " + "; ".join(f"`{r}`: {text}" for r, text in RULES.items())
           + " (`action` for Box actions: floats as `bounded`, which may lie outside the "
           "box: a policy's unclipped samples).",
           ""]
    for s in specs.values():
        title = f"`{s.type}`" + (f" ({s.variant})" if s.variant else "")
        out += [f"#### {title}", "", f"{s.direction}. {s.doc}".strip(), ""]
        if s.fields:
            out += ["| Field | Type | Required | Rule | Meaning |", "|---|---|---|---|---|"]
            out += [f"| `{f.name}` | {f.type} | {'yes' if f.required else 'no'} | "
                    f"{f.rule or ''} | {f.doc} |" for f in s.fields]
            out.append("")
        if s.arrays:
            out += ["| Array | dtype | Shape | Required | Rules | Meaning |",
                    "|---|---|---|---|---|---|"]
            out += [f"| `{a.name}` | {a.dtype} | {_shape_text(a.shape)} | "
                    f"{'yes' if a.required else 'no'} | {', '.join(a.rules)} | {a.doc} |"
                    for a in s.arrays]
            out.append("")
        if s.tensors is not None:
            t = s.tensors
            out += [f"Arrays: {t.doc}; dtype {t.dtype}; rules {', '.join(t.rules)}.", ""]
        notes = [c.describe() for c in s.constraints]
        if s.closed:
            notes.append("no other arrays")
        if not (s.fields or s.arrays or s.tensors):
            notes.append("no fields, no arrays")
        if notes:
            out += ["Also: " + "; ".join(notes) + ".", ""]
    return "\n".join(out).rstrip() + "\n"


def replace_between(path: str, begin: str, end: str, text: str) -> None:
    """Replace what stands between the markers ``begin`` and ``end`` of the file at
    ``path`` with ``text`` (a generated block of a document)."""
    with open(path, encoding="utf-8") as f:
        head, rest = f.read().split(begin, 1)
    tail = rest.split(end, 1)[1]
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{head}{begin}\n{text}{end}{tail}")


def write_into(path: str) -> None:
    """Replace the tables between the markers of ``path`` (docs/protocol.md) with the
    generated ones."""
    replace_between(path, "<!-- messages:begin -->", "<!-- messages:end -->", markdown())


if __name__ == "__main__":
    # python -m zmqrl.bus.messages: print the tables; --write docs/protocol.md: update them
    # Through the imported module, not this __main__ copy: a plug-in's MessageSet is
    # an instance of zmqrl.bus.messages.MessageSet, which this copy's class is not.
    from zmqrl.bus import messages as _module

    if sys.argv[1:2] == ["--write"]:
        _module.write_into(sys.argv[2])
    else:
        sys.stdout.write(_module.markdown())
