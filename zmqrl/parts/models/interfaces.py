"""The model interfaces as code: what a model of each ``interface`` must provide.

A model kind's ``interface`` (``zmqrl.parts.models``) is a name an algorithm's config asks
for (``model_interface``). Here each built-in name has a :class:`typing.Protocol` listing
the methods and attributes that the behaviours and learners of that interface call, with
the shapes they rely on, and :func:`check_model` tests a built model against it: the
members are present, and a forward pass on a tiny dummy batch gives the promised shapes.

Shapes: B is the batch (envs or samples), T the time steps of a time-major unroll,
``*obs`` the env's observation shape, A the action count (discrete) or the flat action
size (Box), ``*act`` the Box action shape, H a recurrent state's size, L a latent size.

A plug-in's own interface (a name not in :data:`PROTOCOLS`) is checked against the
model's ``interface_protocol`` (a runtime-checkable Protocol), members only; with none
there is nothing to check against.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from zmqrl.parts.envs import EnvSpec

State = tuple[torch.Tensor, torch.Tensor]  # a recurrent (h, c), each [B, H]


# ----------------------------------------------------------------------- protocols

@runtime_checkable
class QModel(Protocol):
    """``q`` (DQN; epsilon-greedy acting): ``forward(obs [B, *obs])`` -> Q-values [B, A]
    (the learner's, with autograd; also its target network's) and ``q_values`` the same
    under inference mode (acting)."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor: ...
    def q_values(self, obs: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class ActorCriticModel(Protocol):
    """``actor_critic``, feed-forward (V-trace, A2C, PPO; the actor-critic behaviour):

    * ``forward(obs [B, *obs])`` -> (logits or Gaussian mean [B, A], values [B]);
    * ``act(obs)`` -> (sampled actions int64 [B] or float [B, *act], log-probs [B]);
    * ``evaluate(obs, action [B] or [B, *act])`` -> (log-probs [B], entropy [B],
      values [B]), with autograd;
    * ``state_values(obs)`` -> V [B] (bootstrap of time-limit truncations).
    """

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...
    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...
    def evaluate(self, obs: torch.Tensor, action: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...
    def state_values(self, obs: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class RecurrentActorCriticModel(Protocol):
    """``actor_critic`` with ``recurrent = True`` (``lstm_ac``, ``*_cnn_lstm``):

    * ``state_size`` H; ``initial_state(B)`` -> (h, c) [B, H];
    * ``step(obs [B, *obs], first bool [B], state)`` -> (actions [B] or [B, *act],
      log-probs [B], next state), the state zeroed where ``first`` before the step;
    * ``step_values(obs, first, state)`` -> V [B];
    * ``unroll(obs [T+1, B, *obs], first [T+1, B], state, action [T, B] or
      [T, B, *act])`` -> (log-probs [T, B], entropy [T, B], values [T+1, B]).
    """

    recurrent: bool
    state_size: int

    def initial_state(self, n: int, device: Any = None) -> State: ...
    def step(self, obs: torch.Tensor, first: torch.Tensor, state: State
             ) -> tuple[torch.Tensor, torch.Tensor, State]: ...
    def step_values(self, obs: torch.Tensor, first: torch.Tensor, state: State
                    ) -> torch.Tensor: ...
    def unroll(self, obs: torch.Tensor, first: torch.Tensor, state: State,
               action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class RecurrentQModel(Protocol):
    """``recurrent_q`` (R2D2): ``recurrent = True``, ``state_size`` H,
    ``initial_state(B)`` -> (h, c) [B, H]; ``forward(obs [T, B, *obs], first [T, B],
    state)`` -> (Q [T, B, A], state after the last step) (learner, burn-in);
    ``step(obs [B, *obs], first [B], state)`` -> (Q [B, A], next state) (acting)."""

    recurrent: bool
    state_size: int

    def initial_state(self, n: int, device: Any = None) -> State: ...
    def forward(self, obs: torch.Tensor, first: torch.Tensor, state: State
                ) -> tuple[torch.Tensor, State]: ...
    def step(self, obs: torch.Tensor, first: torch.Tensor, state: State
             ) -> tuple[torch.Tensor, State]: ...


@runtime_checkable
class PolicyValueModel(Protocol):
    """``policy_value`` (AlphaZero): ``forward(obs [B, *obs])`` -> (logits [B, A],
    value in [-1, 1] [B]) (learner); ``predict`` the same under inference mode (search)."""

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...
    def predict(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class MuZeroModel(Protocol):
    """``muzero``: ``latent_size`` L, ``support_size`` S (value and reward are logits
    over 2S+1 bins); ``represent(obs [B, *obs])`` -> latent [B, L];
    ``dynamics(latent [B, L], action int [B])`` -> (next latent [B, L], reward logits
    [B, 2S+1]); ``predict(latent)`` -> (policy logits [B, A], value logits [B, 2S+1])."""

    latent_size: int
    support_size: int

    def represent(self, obs: torch.Tensor) -> torch.Tensor: ...
    def dynamics(self, latent: torch.Tensor, action: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]: ...
    def predict(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class DeterministicActorTwinQModel(Protocol):
    """``deterministic_actor_twin_q`` (TD3; Gaussian-noise acting): ``act(obs [B, *obs])``
    -> actions in env units [B, *act]; ``q(obs, action [B, *act])`` -> (Q1 [B], Q2 [B]);
    ``policy_parameters()`` / ``critic_parameters()``: the two optimisers' parameters."""

    def act(self, obs: torch.Tensor) -> torch.Tensor: ...
    def q(self, obs: torch.Tensor, action: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]: ...
    def policy_parameters(self) -> list[torch.nn.Parameter]: ...
    def critic_parameters(self) -> list[torch.nn.Parameter]: ...


@runtime_checkable
class StochasticActorTwinQModel(Protocol):
    """``stochastic_actor_twin_q`` (SAC; squashed-Gaussian acting): ``action_shape``,
    ``log_alpha`` (scalar parameter: the entropy temperature); ``mean_log_std(obs
    [B, *obs])`` -> (mean [B, A], log-std [B, A]) before the tanh; ``sample(obs)`` ->
    (reparameterised actions in env units [B, *act], log-probs [B]); ``q``,
    ``policy_parameters``, ``critic_parameters`` as TD3's."""

    action_shape: tuple[int, ...]
    log_alpha: torch.Tensor

    def mean_log_std(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...
    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...
    def q(self, obs: torch.Tensor, action: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]: ...
    def policy_parameters(self) -> list[torch.nn.Parameter]: ...
    def critic_parameters(self) -> list[torch.nn.Parameter]: ...


# interface name -> its Protocol. A recurrent ``actor_critic`` model (``recurrent =
# True``) is held to RecurrentActorCriticModel instead (see protocol_for).
PROTOCOLS: dict[str, type] = {
    "q": QModel,
    "actor_critic": ActorCriticModel,
    "recurrent_q": RecurrentQModel,
    "policy_value": PolicyValueModel,
    "muzero": MuZeroModel,
    "deterministic_actor_twin_q": DeterministicActorTwinQModel,
    "stochastic_actor_twin_q": StochasticActorTwinQModel,
}


def protocol_for(interface: str, model: Any) -> type | None:
    """The Protocol ``model`` is held to as a provider of ``interface``: zmqrl's own for
    a built-in name, else the model's ``interface_protocol`` (None: nothing to check)."""
    if interface == "actor_critic" and getattr(model, "recurrent", False):
        return RecurrentActorCriticModel
    return PROTOCOLS.get(interface) or getattr(model, "interface_protocol", None)


def _members(protocol: type) -> dict[str, bool]:
    """A Protocol's members -> whether each is a method (else a data attribute)."""
    found: dict[str, bool] = {}
    for base in reversed(protocol.__mro__):
        if base in (object, Protocol) or not getattr(base, "_is_protocol", False):
            continue
        for name in base.__dict__.get("__annotations__", {}):
            found.setdefault(name, False)
        for name, value in base.__dict__.items():
            if not name.startswith("_") and callable(value):
                found[name] = True
    return found


# ----------------------------------------------------------------- forward checks

B, T = 3, 2  # the dummy batch: 3 rows (unlike a 2-action env), unrolls of 2 steps


class _Probe:
    """Calls a model's methods on dummy inputs and collects the problems, each naming
    the class, the method, what was expected and what came back."""

    def __init__(self, model: Any, spec: EnvSpec):
        self.model, self.spec, self.problems = model, spec, []
        self.name = type(model).__name__
        params = next(iter(model.parameters()), None) if hasattr(model, "parameters") \
            else None
        self.device = params.device if params is not None else torch.device("cpu")
        self.discrete = spec.num_actions is not None
        self.act_shape = tuple(spec.action_shape)
        self.A = int(spec.num_actions) if self.discrete else int(np.prod(self.act_shape))

    def obs(self, *lead: int) -> torch.Tensor:
        dtype = torch.from_numpy(np.zeros(0, self.spec.obs_dtype)).dtype
        return torch.zeros(*lead, *self.spec.obs_shape, dtype=dtype, device=self.device)

    def action(self, *lead: int) -> torch.Tensor:
        """Discrete: action 0; Box: the middle of the bounds (0 if there are none)."""
        if self.discrete:
            return torch.zeros(*lead, dtype=torch.int64, device=self.device)
        mid = np.zeros(self.act_shape, np.float32)
        if self.spec.action_low is not None and self.spec.action_high is not None:
            mid = ((self.spec.action_low + self.spec.action_high) / 2).astype(np.float32)
        return torch.as_tensor(mid, device=self.device).expand(*lead, *self.act_shape).clone()

    def first(self, *lead: int) -> torch.Tensor:
        return torch.ones(*lead, dtype=torch.bool, device=self.device)

    def call(self, method: str, *args: Any, parts: int = 0) -> Any:
        """``model.method(*args)`` (``forward`` through ``model(...)``); None after
        recording a problem if it raises, returns None, or does not give a
        ``parts``-tuple."""
        try:
            fn = self.model if method == "forward" else getattr(self.model, method)
            out = fn(*args)
        except Exception as exc:  # noqa: BLE001 (any failure is a problem to report)
            self.problems.append(f"{self.name}.{method}: raised {type(exc).__name__}: {exc}")
            return None
        if out is None:
            self.problems.append(f"{self.name}.{method}: expected a result, got None")
            return None
        if parts and not (isinstance(out, (tuple, list)) and len(out) == parts):
            got = f"{len(out)}-tuple" if isinstance(out, (tuple, list)) \
                else type(out).__name__
            self.problems.append(f"{self.name}.{method}: expected a {parts}-tuple, got {got}")
            return None
        return out

    def shape(self, method: str, what: str, value: Any, *expected: int) -> None:
        if value is None:  # the call failed: reported already
            return
        if isinstance(value, torch.Tensor) and tuple(value.shape) == expected:
            return
        got = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        self.problems.append(f"{self.name}.{method}: expected {what} of shape "
                             f"{list(expected)}, got {got}")

    def state(self, method: str, state: Any, size: int) -> None:
        if not (isinstance(state, (tuple, list)) and len(state) == 2):
            self.problems.append(f"{self.name}.{method}: expected a state (h, c), got "
                                 f"{type(state).__name__}")
            return
        for part, value in zip("hc", state, strict=True):
            self.shape(method, f"state {part}", value, B, size)


def _check_q(p: _Probe) -> None:
    obs = p.obs(B)
    for method in ("forward", "q_values"):
        p.shape(method, "Q-values", p.call(method, obs), B, p.A)


def _check_actor_critic(p: _Probe) -> None:
    if getattr(p.model, "recurrent", False):
        return _check_recurrent_actor_critic(p)
    obs, act = p.obs(B), p.action(B)
    out = p.call("forward", obs, parts=2)
    if out is not None:
        p.shape("forward", "policy head", out[0], B, p.A)
        p.shape("forward", "values", out[1], B)
    out = p.call("act", obs, parts=2)
    if out is not None:
        p.shape("act", "actions", out[0], B, *p.act_shape)
        p.shape("act", "log-probs", out[1], B)
    out = p.call("evaluate", obs, act, parts=3)
    if out is not None:
        for what, value in zip(("log-probs", "entropy", "values"), out, strict=True):
            p.shape("evaluate", what, value, B)
    p.shape("state_values", "values", p.call("state_values", obs), B)


def _initial_state(p: _Probe) -> Any:
    state = p.call("initial_state", B, p.device)
    p.state("initial_state", state, int(getattr(p.model, "state_size", -1)))
    return state


def _check_recurrent_actor_critic(p: _Probe) -> None:
    H = int(p.model.state_size)
    state = _initial_state(p)
    if state is None:
        return
    out = p.call("step", p.obs(B), p.first(B), state, parts=3)
    if out is not None:
        p.shape("step", "actions", out[0], B, *p.act_shape)
        p.shape("step", "log-probs", out[1], B)
        p.state("step", out[2], H)
    p.shape("step_values", "values", p.call("step_values", p.obs(B), p.first(B), state), B)
    out = p.call("unroll", p.obs(T + 1, B), p.first(T + 1, B), state, p.action(T, B),
                 parts=3)
    if out is not None:
        p.shape("unroll", "log-probs", out[0], T, B)
        p.shape("unroll", "entropy", out[1], T, B)
        p.shape("unroll", "values", out[2], T + 1, B)


def _check_recurrent_q(p: _Probe) -> None:
    H = int(p.model.state_size)
    state = _initial_state(p)
    if state is None:
        return
    out = p.call("forward", p.obs(T, B), p.first(T, B), state, parts=2)
    if out is not None:
        p.shape("forward", "Q-values", out[0], T, B, p.A)
        p.state("forward", out[1], H)
    out = p.call("step", p.obs(B), p.first(B), state, parts=2)
    if out is not None:
        p.shape("step", "Q-values", out[0], B, p.A)
        p.state("step", out[1], H)


def _check_policy_value(p: _Probe) -> None:
    obs = p.obs(B)
    for method in ("forward", "predict"):
        out = p.call(method, obs, parts=2)
        if out is not None:
            p.shape(method, "logits", out[0], B, p.A)
            p.shape(method, "values", out[1], B)


def _check_muzero(p: _Probe) -> None:
    L, bins = int(p.model.latent_size), 2 * int(p.model.support_size) + 1
    latent = p.call("represent", p.obs(B))
    p.shape("represent", "latent", latent, B, L)
    if not isinstance(latent, torch.Tensor):
        return
    out = p.call("dynamics", latent, p.action(B), parts=2)
    if out is not None:
        p.shape("dynamics", "next latent", out[0], B, L)
        p.shape("dynamics", "reward logits", out[1], B, bins)
    out = p.call("predict", latent, parts=2)
    if out is not None:
        p.shape("predict", "policy logits", out[0], B, p.A)
        p.shape("predict", "value logits", out[1], B, bins)


def _check_twin_q(p: _Probe) -> None:
    """What both actor-twin-Q interfaces share: the critics and the parameter groups."""
    out = p.call("q", p.obs(B), p.action(B), parts=2)
    if out is not None:
        p.shape("q", "Q1", out[0], B)
        p.shape("q", "Q2", out[1], B)
    for method in ("policy_parameters", "critic_parameters"):
        params = p.call(method)
        if params is not None and not list(params):
            p.problems.append(f"{p.name}.{method}: expected parameters, got none")


def _check_deterministic(p: _Probe) -> None:
    p.shape("act", "actions", p.call("act", p.obs(B)), B, *p.act_shape)
    _check_twin_q(p)


def _check_stochastic(p: _Probe) -> None:
    out = p.call("mean_log_std", p.obs(B), parts=2)
    if out is not None:
        p.shape("mean_log_std", "mean", out[0], B, p.A)
        p.shape("mean_log_std", "log-std", out[1], B, p.A)
    out = p.call("sample", p.obs(B), parts=2)
    if out is not None:
        p.shape("sample", "actions", out[0], B, *p.act_shape)
        p.shape("sample", "log-probs", out[1], B)
    p.shape("log_alpha", "the temperature", p.model.log_alpha)  # a scalar
    _check_twin_q(p)


# interface name -> its forward check (a plug-in's interface has none: members only)
CHECKS: dict[str, Callable[[_Probe], None]] = {
    "q": _check_q,
    "actor_critic": _check_actor_critic,
    "recurrent_q": _check_recurrent_q,
    "policy_value": _check_policy_value,
    "muzero": _check_muzero,
    "deterministic_actor_twin_q": _check_deterministic,
    "stochastic_actor_twin_q": _check_stochastic,
}


def check_model(interface: str, model: Any, spec: EnvSpec) -> list[str]:
    """What is wrong with ``model`` as a provider of ``interface`` for an env of
    ``spec`` (empty: nothing). First the Protocol's members (missing, or a data
    attribute where a method is due); then, if all are there, a forward pass on a
    dummy batch of B=3 (T=2 for unrolls) under ``torch.no_grad``, against the shapes
    the Protocol's docstring promises. Each problem names the model's class and the
    method. An interface with no Protocol (a plug-in's, without ``interface_protocol``)
    gives none."""
    protocol = protocol_for(interface, model)
    if protocol is None:
        return []
    name = type(model).__name__
    problems: list[str] = []
    if not isinstance(model, protocol):
        # Name what lacks. hasattr, not isinstance's own test: from Python 3.12 that
        # reads attributes statically and misses nn.Module parameters (log_alpha).
        problems = [f"{name}.{member}: missing (the {interface} interface, "
                    f"{protocol.__name__}, needs it)"
                    for member in _members(protocol) if not hasattr(model, member)]
    problems += [f"{name}.{member}: expected a method, got "
                 f"{type(getattr(model, member)).__name__}"
                 for member, method in _members(protocol).items()
                 if method and hasattr(model, member) and not callable(getattr(model, member))]
    check = CHECKS.get(interface) if interface in PROTOCOLS else None  # zmqrl's own only
    if problems or check is None:
        return problems
    probe = _Probe(model, spec)
    with torch.no_grad():
        check(probe)
    return probe.problems
