"""Gymnasium construction: vector envs, and what the rest of the system needs to know
about spaces (observation shape and dtype, action shape, dtype and bounds).

Importing this module also registers zmqrl's own env ids, so a topology can name them
like any gymnasium id:

* ``zmqrl/CartPoleNoVelocity-v1``: CartPole with the two velocity components hidden
  (observation: cart position, pole angle). Partially observable: a policy has to infer
  the velocities from history, which a feed-forward network cannot (R2D2's test bed).
* ``zmqrl/Atari-<Game>-v5`` and ``zmqrl/MinAtar-<Game>-v1``: pixel envs with uint8
  [C, H, W] observations (``zmqrl.parts.pixel_envs``).

Observations travel as float32, except uint8 ones (pixels), which stay uint8 from the
env to the model's first layer: on the wire, in unrolls and in replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from zmqrl.bus.messages import DEFAULT_MAX_ABS_VALUE
from zmqrl.parts import games, pixel_envs  # noqa: F401  (register the game and pixel env ids)


@dataclass(frozen=True)
class EnvSpec:
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    action_shape: tuple[int, ...]  # () for discrete actions
    action_dtype: np.dtype
    num_actions: int | None  # discrete action count; None for continuous
    # Box actions: the bounds (float32 arrays of action_shape); None for discrete
    action_low: np.ndarray | None = None
    action_high: np.ndarray | None = None
    # The largest magnitude of an observation, reward or action a port accepts (the
    # topology's env.max_abs_value): finite is not enough, 3e38 overflows a loss.
    max_abs: float = DEFAULT_MAX_ABS_VALUE


class HideVelocity(gym.ObservationWrapper):
    """Keeps only the observation components in ``keep`` (CartPole: position, angle)."""

    def __init__(self, env: gym.Env, keep: tuple[int, ...] = (0, 2)):
        super().__init__(env)
        self.keep = np.array(keep)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(space.low[self.keep], space.high[self.keep],
                                                dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.keep]


def _cartpole_no_velocity(**kwargs: Any) -> gym.Env:
    return HideVelocity(gym.make("CartPole-v1", **kwargs).unwrapped)


if "zmqrl/CartPoleNoVelocity-v1" not in gym.registry:
    gym.register("zmqrl/CartPoleNoVelocity-v1", entry_point=_cartpole_no_velocity,
                 max_episode_steps=500, reward_threshold=475.0)


def env_action(action: np.ndarray, spec: EnvSpec) -> np.ndarray:
    """What the env is stepped with: Box actions clipped to the bounds. The policy's own
    sample (unclipped) is what experience records, so its log-prob stays exact; the
    clip is part of the environment (CleanRL and SB3 do the same)."""
    if spec.action_low is None:
        return action
    return np.clip(action, spec.action_low, spec.action_high)


def make_vector_env(env_cfg: dict[str, Any], num_envs: int, seed: int) -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``env_cfg['id']`` stepped in this process.

    SAME_STEP autoreset: when an episode ends, the returned observation is already the
    first observation of the next one, so every transition we ship is a real one.
    """
    env = gym.make_vec(
        env_cfg["id"],
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
        **env_cfg.get("kwargs", {}),
    )
    env.action_space.seed(seed)
    return env


def obs_wire_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype observations travel and are stored in: uint8 stays uint8 (pixels: a
    quarter of float32's bytes, and no float copy of a frame anywhere), anything else is
    float32 (MuJoCo's float64 included)."""
    return np.dtype(np.uint8) if np.dtype(dtype) == np.uint8 else np.dtype(np.float32)


def env_spec(env_cfg: dict[str, Any]) -> EnvSpec:
    env = gym.make(env_cfg["id"], **env_cfg.get("kwargs", {}))
    try:
        obs, act = env.observation_space, env.action_space
    finally:
        env.close()
    if not isinstance(obs, gym.spaces.Box):
        raise ValueError(f"env {env_cfg['id']}: observation space {obs} is not a Box")
    obs_dtype = obs_wire_dtype(obs.dtype)
    max_abs = float(env_cfg.get("max_abs_value", DEFAULT_MAX_ABS_VALUE))
    if isinstance(act, gym.spaces.Discrete):
        return EnvSpec(obs.shape, obs_dtype, (), np.dtype(np.int64), int(act.n),
                       max_abs=max_abs)
    if isinstance(act, gym.spaces.Box):
        return EnvSpec(obs.shape, obs_dtype, act.shape, np.dtype(np.float32), None,
                       act.low.astype(np.float32), act.high.astype(np.float32), max_abs)
    raise ValueError(f"env {env_cfg['id']}: action space {act} is not Discrete or Box")
