"""The acting interface every architecture plugs into, and the batching core over it.

A :class:`Behaviour` is the acting side of one *connection*: ``n`` envs stepped in
lockstep, by a remote actor talking to the inference broker or by a local actor. It
owns what acting an architecture needs besides the model: recurrent state, exploration,
the trajectory it is cutting, and the items it ships (unrolls, n-step transitions,
sequences, gradients). Per step, in this order::

    b.outcome(reward, done, truncated, final_obs)  # of the last actions (no-op before any)
    b.observe(obs, fields)                          # the new observations (+ step header)
    items = b.take()                                # what is ready to ship
    ... act_batched(model, [b, ...], version) ...   # one forward pass over connections
                                                    #   -> b.inputs(), forward, b.record()

``truncated`` [n] bool marks the envs of ``done`` whose episode a time limit cut, and
``final_obs`` holds their final observations, one row per such env (the wire's ``step``
carries exactly these). The inference broker keeps a behaviour per actor connection and
calls :func:`act_batched` on all of them at once; a local actor is the same behaviour
with one connection. Recurrent state lives in the behaviour and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from zmqrl.parts.algo_config import AlgoConfig
from zmqrl.parts.envs import EnvSpec

if TYPE_CHECKING:  # torch is imported where a forward pass runs: a remote actor never does
    import torch


@dataclass
class Item:
    """One message a behaviour wants shipped: a wire type, its arrays and fields."""

    type: str
    arrays: dict[str, np.ndarray]
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class ActingSetup:
    """What every connection's behaviour shares: the env's spec, the model it acts with
    (the node loads new parameters into it), the algorithm's config, and defaults for
    exploration."""

    spec: EnvSpec
    model: torch.nn.Module
    cfg: AlgoConfig
    epsilon: float = 0.01  # ε-greedy behaviours: until a step header says otherwise
    seed: int = 0
    # This actor's behaviour arguments (zmqrl.parts.acting.envs.behaviour_args: a noise
    # scale, a temperature, ...); a remote actor's ride in its step header's ``args``.
    args: dict[str, float] = field(default_factory=dict)
    # Replay behaviours: compute |δ| priorities for what they insert (two more forward
    # passes per step; only a prioritized replay uses them), and hold transitions back
    # until this many can go in one insert (Ape-X's local buffer: fewer, larger messages).
    priorities: bool = True
    insert_batch: int = 1
    # The forward passes' arithmetic: "float32", or "bfloat16" (and on CUDA "float16")
    # under torch.autocast. The parameters stay float32 (what the learner publishes
    # loads as is); a conv net's leaf evaluations take half the time in bfloat16 on a
    # CPU with AVX-512 BF16 (BENCHMARKS.md, AlphaZero).
    precision: str = "float32"

    @property
    def to_device(self) -> Any:
        """The model's ``HostToDevice`` (pinned staging buffers on CUDA), made once.
        This runs per forward pass: the model's first parameter is kept, so checking
        where it lives (the model may have moved) costs an attribute, not a walk
        over its modules."""
        cached = self.__dict__.get("_to_device")
        if cached is None or cached[0].device != cached[1].device:
            from zmqrl.parts.devices import HostToDevice

            first = next(self.model.parameters())
            cached = self.__dict__["_to_device"] = (first, HostToDevice(first.device))
        return cached[1]

    def autocast(self) -> Any:
        """The context a forward pass runs in: ``precision`` on the model's device."""
        from zmqrl.parts.devices import autocast

        return autocast(self.to_device.device, self.precision)


def host(tensor: torch.Tensor) -> np.ndarray:
    """A forward pass's floating output as a float32 numpy array on the host (under
    reduced precision it may be bfloat16, which numpy has no type for)."""
    return tensor.float().cpu().numpy()


class Behaviour:
    """One connection's acting (see the module docstring). Subclasses define
    :meth:`inputs`, :meth:`forward`, :meth:`record` and :meth:`_outcome`, and may
    override :meth:`observe` and :meth:`take`."""

    ships: ClassVar[str] = ""  # the wire type of its items, for documentation and checks
    # ε-greedy: takes ε from ActingSetup, and from a step header's ``epsilon`` field (a
    # remote actor sends its own, so the broker explores as that actor should).
    explores_by_epsilon: ClassVar[bool] = False
    # Whether a connection's steps are env steps (an actor's envs). A search's leaf
    # evaluations are not: the broker counts those as evaluations, not env steps.
    steps_envs: ClassVar[bool] = True
    # The ``step`` variant its requester sends (``zmqrl.bus.messages``; "" the plain
    # one): a behaviour whose requests carry other arrays (MuZero's search queries)
    # declares its own in a MessageSet and reads them in :meth:`observe_step`.
    step_variant: ClassVar[str] = ""

    @classmethod
    def held_bytes_per_env(cls, setup: ActingSetup) -> int:
        """What a connection of this behaviour holds per env besides what the broker's
        caps count already (an unroll's observations: ``max_envs_per_connection``), such
        as a search's latents; the broker bounds the sum (``max_held_mib``)."""
        return 0

    def __init__(self, setup: ActingSetup, n: int):
        self.setup = setup
        self.spec = setup.spec
        self.model = setup.model
        self.n = n
        self.obs: np.ndarray | None = None
        self.acted = False  # an action was taken and its outcome not yet recorded
        self._ready: list[Item] = []

    # ----- per step -----------------------------------------------------------------
    def outcome(self, reward: np.ndarray, done: np.ndarray, truncated: np.ndarray,
                final_obs: np.ndarray) -> None:
        """The result of the last actions; nothing before the first action."""
        if self.acted:
            self.acted = False
            self._outcome(reward, done, truncated, final_obs)

    def observe_step(self, msg: Any) -> None:
        """A requester's ``step`` (a ``zmqrl.bus.wire.Message``, checked against
        :attr:`step_variant`): the outcome of the last actions, then the new observations
        (what the inference broker calls; a local actor calls :meth:`outcome` and
        :meth:`observe` itself)."""
        truncated, final = msg.arrays.get("truncated"), msg.arrays.get("final_obs")
        if truncated is None:  # most steps end no episode by a time limit: arrays made once
            none = self.__dict__.get("_no_truncation")
            if none is None:
                none = self.__dict__["_no_truncation"] = (
                    np.zeros(self.n, np.bool_),
                    np.zeros((0, *self.spec.obs_shape), self.spec.obs_dtype))
            truncated, final = none
        self.outcome(msg["reward"], msg["done"], truncated, final)
        self.observe(msg["obs"], msg.fields)

    def observe(self, obs: np.ndarray, fields: dict[str, Any] | None = None) -> None:
        """The current observations ([n, *obs_shape]) and the step's header fields."""
        self.obs = obs

    def inputs(self) -> dict[str, np.ndarray]:
        """Model inputs for the current observations, each with leading dimension n."""
        raise NotImplementedError

    @staticmethod
    def forward(model: torch.nn.Module, inputs: dict[str, torch.Tensor]
                ) -> dict[str, np.ndarray]:
        """One forward pass over the inputs of any number of connections (concatenated
        along the first dimension); outputs with the same leading dimension."""
        raise NotImplementedError

    def record(self, outputs: dict[str, np.ndarray], version: int) -> np.ndarray:
        """This connection's share of the outputs: remember what the trajectory needs and
        return the actions [n, *action_shape] in the env's action dtype."""
        raise NotImplementedError

    def _outcome(self, reward: np.ndarray, done: np.ndarray, truncated: np.ndarray,
                 final_obs: np.ndarray) -> None:
        raise NotImplementedError

    def greedy(self) -> np.ndarray | None:
        """The greedy actions [n, *action_shape] for the current observations, recording
        nothing (``zmqrl play --greedy``: the policy without its exploration); None: this
        behaviour has no greedy mode. An ε-greedy one needs none: ε 0 is its greedy mode."""
        return None

    def take(self) -> list[Item]:
        """The items completed since the last call (and forget them)."""
        ready, self._ready = self._ready, []
        return ready

    def reply(self, actions: np.ndarray) -> dict[str, np.ndarray]:
        """The arrays of this connection's ``act`` reply: the actions; a behaviour whose
        requester wants more of the forward pass (a search's priors and values) adds it."""
        return {"action": actions}


def act_batched(model: torch.nn.Module, behaviours: list[Behaviour],
                version: int) -> list[np.ndarray]:
    """One forward pass for every connection in ``behaviours`` (all of one class), each
    from its own state: concatenate their inputs, run the model once, split the outputs
    back and let each record its share. Returns the actions per connection.

    The forward pass runs under ``torch.inference_mode()``, whatever the behaviour's
    ``forward`` does: acting never needs autograd, and a behaviour's outputs become
    numpy arrays (a tensor that requires grad cannot)."""
    import torch  # loaded already: a forward pass needs a model

    parts = [b.inputs() for b in behaviours]
    if len(parts) == 1:
        joined = parts[0]
    else:
        joined = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    setup = behaviours[0].setup
    inputs = setup.to_device.batch(joined)
    with torch.inference_mode():
        if setup.precision == "float32":
            outputs = type(behaviours[0]).forward(model, inputs)
        else:
            with setup.autocast():
                outputs = type(behaviours[0]).forward(model, inputs)
    actions, start = [], 0
    for b in behaviours:
        end = start + b.n
        actions.append(b.record({k: v[start:end] for k, v in outputs.items()}, version))
        b.acted = True
        start = end
    return actions


class EpisodeLog:
    """Returns and lengths of finished episodes, pooled until an unroll carries them to
    the learner (for its metrics). With ``keep`` False (the items shipped are not
    unrolls, or nothing is shipped) it drops them: nothing would ever take them."""

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.returns: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []

    def add(self, returns: np.ndarray, lengths: np.ndarray) -> None:
        if self.keep and len(returns):
            self.returns.append(np.asarray(returns, np.float32))
            self.lengths.append(np.asarray(lengths, np.int32))

    def attach(self, arrays: dict[str, np.ndarray]) -> None:
        """Add ``ep_return``/``ep_length`` of everything pooled so far to ``arrays``
        (and forget them). Arrays that already carry episodes keep theirs: a behaviour
        that scores its own (self-play: the learner's seat) knows better than the envs."""
        if self.returns:
            arrays.setdefault("ep_return", np.concatenate(self.returns))
            arrays.setdefault("ep_length", np.concatenate(self.lengths))
            self.returns, self.lengths = [], []


def take_all(pending: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray] | None:
    """The batches in ``pending`` joined into one (batch-major), emptying it; None if
    there are none."""
    if not pending:
        return None
    items = {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}
    pending.clear()
    return items
