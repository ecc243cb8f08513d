"""What a learner checks in the experience it is handed, before it stores, credits or
trains on it: unrolls on its ``experience`` port and ``batch`` replies from a replay.

Every violation raises :class:`wire.ProtocolError` (one log line and, on a ROUTER port,
an ``error`` reply): a producer that talks to the learner directly (IMPALA's local-policy
actors bypass the broker's checks) or a replay that stored something bad must not crash
it, and one NaN trained on would poison every parameter the learner then publishes.

All checks live here, in one place, so that moving them onto the message declarations
(``zmqrl.messages.check``, once it exists) is a change of this module only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zmqrl import wire
from zmqrl.envs import EnvSpec

UNROLL_KEYS = ("obs", "action", "logp", "reward", "done")
STATE_KEYS = ("state_h", "state_c")  # unrolls of a recurrent policy (lstm_ac)
TRANSITION_KEYS = ("obs", "action", "reward", "discount", "next_obs")
SEQUENCE_KEYS = ("obs", "action", "reward", "done", "state_h", "state_c")


@dataclass(frozen=True)
class ExperienceSpec:
    """The dimensions a learner knows: the env's spaces, the unroll length T (unroll
    algorithms), the recurrent state size H (0: none in the data)."""

    env: EnvSpec
    unroll: int = 0
    state_size: int = 0


def check_unroll(msg: wire.Message, spec: ExperienceSpec) -> int:
    """An ``unroll`` the learner can queue and train on; returns its env columns n."""
    keys = UNROLL_KEYS + (STATE_KEYS if spec.state_size else ())
    missing = [k for k in keys if k not in msg.arrays]
    if missing:
        raise wire.ProtocolError(f"unroll lacks {', '.join(missing)}")
    version = msg.fields.get("version", 0)
    if type(version) is not int or version < 0:  # it becomes a policy lag: int arithmetic
        raise wire.ProtocolError(f"unroll 'version' must be an int >= 0, got {version!r}")
    T, obs_shape = spec.unroll, spec.env.obs_shape
    n = msg["action"].shape[1] if msg["action"].ndim >= 2 else -1
    want = {
        "obs": (T + 1, n, *obs_shape),
        "action": (T, n, *spec.env.action_shape),
        "logp": (T, n), "reward": (T, n), "done": (T, n),
    }
    if spec.state_size:  # a recurrent policy's unrolls carry the state they began with
        want["state_h"] = want["state_c"] = (1, n, spec.state_size)
    for key, shape in want.items():
        if n < 1 or msg[key].shape != shape:
            raise wire.ProtocolError(
                f"unroll '{key}' has shape {list(msg[key].shape)}, expected {list(shape)}")
    _check_bool(msg, "done")
    floats = ("obs", "logp", "reward") + (STATE_KEYS if spec.state_size else ())
    _check_finite(msg, floats)
    _check_actions(msg, spec.env)
    _check_episode_stats(msg)
    return n


def check_batch(msg: wire.Message, spec: ExperienceSpec, sequences: bool) -> int:
    """A replay's ``batch`` reply the learner can train on (transitions, or sequences
    with their stored recurrent state); returns its size B."""
    keys = (SEQUENCE_KEYS if sequences else TRANSITION_KEYS) + ("key", "weight")
    missing = [k for k in keys if k not in msg.arrays]
    if missing:
        raise wire.ProtocolError(f"batch lacks {', '.join(missing)}")
    B = msg["key"].shape[0] if msg["key"].ndim == 1 else -1
    obs_shape, action_shape = spec.env.obs_shape, spec.env.action_shape
    if sequences:
        L = msg["reward"].shape[1] if msg["reward"].ndim == 2 else -1
        want = {"obs": (B, L + 1, *obs_shape), "action": (B, L, *action_shape),
                "reward": (B, L), "done": (B, L), "state_h": (B, spec.state_size),
                "state_c": (B, spec.state_size)}
        ok = L >= 1
    else:
        want = {"obs": (B, *obs_shape), "next_obs": (B, *obs_shape),
                "action": (B, *action_shape), "reward": (B,), "discount": (B,)}
        ok = True
    want.update(key=(B,), weight=(B,))
    for key, shape in want.items():
        if not ok or B < 1 or msg[key].shape != shape:
            raise wire.ProtocolError(
                f"batch '{key}' has shape {list(msg[key].shape)}, expected {list(shape)}")
    if msg["key"].dtype.kind not in "iu":
        raise wire.ProtocolError(f"batch 'key' must be integers, got {msg['key'].dtype}")
    floats = ("obs", "reward", "weight") + (
        ("state_h", "state_c") if sequences else ("discount", "next_obs"))
    _check_finite(msg, floats)
    if np.any(msg["weight"] < 0):
        raise wire.ProtocolError("batch 'weight' must be >= 0")
    if sequences:
        _check_bool(msg, "done")
    elif np.any((msg["discount"] < 0) | (msg["discount"] > 1)):
        raise wire.ProtocolError("batch 'discount' must lie in [0, 1]")
    _check_actions(msg, spec.env)
    return B


def _check_finite(msg: wire.Message, keys: tuple[str, ...]) -> None:
    for key in keys:
        if msg[key].dtype.kind != "f" or not np.isfinite(msg[key]).all():
            raise wire.ProtocolError(f"'{key}' must be finite floats")


def _check_bool(msg: wire.Message, key: str) -> None:
    if msg[key].dtype != np.bool_:
        raise wire.ProtocolError(f"'{key}' must be bool, got {msg[key].dtype}")


def _check_actions(msg: wire.Message, env: EnvSpec) -> None:
    """Discrete actions are indices the model has; continuous ones finite floats."""
    action = msg["action"]
    if env.num_actions is None:
        if action.dtype.kind != "f" or not np.isfinite(action).all():
            raise wire.ProtocolError("'action' must be finite floats (continuous actions)")
    elif action.dtype.kind not in "iu" or (action.size and (
            action.min() < 0 or action.max() >= env.num_actions)):
        raise wire.ProtocolError(f"'action' must be integers in [0, {env.num_actions})")


def _check_episode_stats(msg: wire.Message) -> None:
    """Optional ``ep_return`` float [k] and ``ep_length`` int [k], together: they feed
    the learner's episode statistics and its metrics row."""
    returns, lengths = msg.arrays.get("ep_return"), msg.arrays.get("ep_length")
    if returns is None and lengths is None:
        return
    if returns is None or lengths is None:
        raise wire.ProtocolError("'ep_return' and 'ep_length' must come together")
    if returns.ndim != 1 or lengths.shape != returns.shape:
        raise wire.ProtocolError(
            f"'ep_return' and 'ep_length' must be 1-D of one length, got "
            f"{list(returns.shape)} and {list(lengths.shape)}")
    if returns.dtype.kind != "f" or not np.isfinite(returns).all():
        raise wire.ProtocolError("'ep_return' must be finite floats")
    if lengths.dtype.kind not in "iu" or (lengths.size and lengths.min() < 0):
        raise wire.ProtocolError("'ep_length' must be integers >= 0")
