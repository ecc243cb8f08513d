"""Pixel environments: Atari through ale-py with the standard preprocessing, and MinAtar
as a CPU-sized pixel benchmark. Both give channels-first uint8 observations, which stay
uint8 on the wire, in unrolls and in replay; the conv models divide by 255 on their
device (``zmqrl.parts.models.conv``).

Importing this module (``zmqrl.parts.envs`` does) registers the ids; it imports neither
ale-py nor MinAtar, which are only needed when such an env is made
(``pip install 'zmqrl[atari]'``).

* ``zmqrl/Atari-<Game>-v5`` (``Pong``, ``Breakout``, ``SpaceInvaders``, ... every ROM
  ale-py ships): ale-py's ``ALE/<Game>-v5`` at ``frameskip=1`` under gymnasium's
  ``AtariPreprocessing`` (84x84 grey, frame skip 4 with max-pooling of the last two
  frames, up to 30 no-ops at reset) and ``FrameStackObservation`` (4): observations
  uint8 [4, 84, 84]. The choices, each an env kwarg:

  - v5's sticky actions stay on (``repeat_action_probability=0.25``, Machado et al.
    2018); ``repeat_action_probability: 0.0`` gives the deterministic NoFrameskip-v4
    dynamics of the DQN/IMPALA papers.
  - ``terminal_on_life_loss=False``: a life lost is not an episode end (the modern
    default; Machado et al. found episodic life no help).
  - ``clip_reward=False``: rewards are not clipped here, so the returns actors report
    are game scores. Pong's rewards are +-1 anyway; for games with large rewards set
    ``clip_reward: true`` (then the reported returns are clipped ones too) or a
    learner-side ``reward_scale``.
  - episodes are cut at v5's 108,000 frames (27,000 agent steps): a truncation, which
    the actors bootstrap.

* ``zmqrl/MinAtar-<Game>-v1`` (``Asterix``, ``Breakout``, ``Freeway``, ``Seaquest``,
  ``SpaceInvaders``): MinAtar (Young & Tian 2019) with its defaults, sticky actions 0.1
  and difficulty ramping, and the minimal action set (MinAtar's own ``-v1``).
  Observations are the game's 10x10xC boolean channels as uint8 [C, 10, 10] holding 0
  or 255, so that the conv models' /255 gives MinAtar's 0/1 inputs. Episodes are cut at
  10,000 steps (a truncation; MinAtar itself has no limit and a perfect Breakout
  player never loses).

  Only MinAtar's game modules are used (pure numpy); its ``Environment`` wrapper
  imports matplotlib and seaborn for rendering, which took 10+ s per process on a
  loaded machine, so this module steps the game itself (sticky actions as MinAtar's
  ``Environment.act`` does them).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import gymnasium as gym
import numpy as np

ATARI_INSTALL = "pip install 'zmqrl[atari]'"
# Registered even without ale-py, so that naming one gives the install hint.
COMMON_ATARI = ("Pong", "Breakout", "SpaceInvaders", "Seaquest", "Qbert", "BeamRider",
                "Enduro", "MsPacman", "Asterix")
MINATAR_GAMES = {"Asterix": "asterix", "Breakout": "breakout", "Freeway": "freeway",
                 "Seaquest": "seaquest", "SpaceInvaders": "space_invaders"}
MINATAR_MAX_STEPS = 10_000


def _package_dir(name: str) -> Path | None:
    """Where an installed package lives, without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def atari_games() -> list[str]:
    """Game names (ale-py's PascalCase) of every ROM the installed ale-py ships; the
    common ones when ale-py is not installed."""
    ale = _package_dir("ale_py")
    roms = sorted((ale / "roms").glob("*.bin")) if ale is not None else []
    # ale_py.registration.rom_id_to_name: snake_case -> PascalCase
    return [p.stem.title().replace("_", "") for p in roms] or list(COMMON_ATARI)


# ----- Atari ---------------------------------------------------------------------------
def make_atari(game: str, *, frame_stack: int = 4, frame_skip: int = 4, noop_max: int = 30,
               screen_size: int = 84, terminal_on_life_loss: bool = False,
               clip_reward: bool = False, **ale_kwargs: Any) -> gym.Env:
    """``ALE/<game>-v5`` (``ale_kwargs`` go to it: ``repeat_action_probability``,
    ``full_action_space``, ``mode``, ...) preprocessed as the module docstring says."""
    try:
        import ale_py
    except ImportError:
        raise gym.error.DependencyNotInstalled(
            f"Atari needs ale-py: {ATARI_INSTALL}") from None
    from gymnasium.wrappers import AtariPreprocessing, ClipReward, FrameStackObservation

    gym.register_envs(ale_py)
    env = gym.make(f"ALE/{game}-v5", frameskip=1, **ale_kwargs)
    env = AtariPreprocessing(env, noop_max=noop_max, frame_skip=frame_skip,
                             screen_size=screen_size, terminal_on_life_loss=terminal_on_life_loss,
                             grayscale_obs=True, scale_obs=False)
    if clip_reward:
        env = ClipReward(env, -1.0, 1.0)
    return FrameStackObservation(env, frame_stack)


# ----- MinAtar ---------------------------------------------------------------------------
def _minatar_game(game: str) -> ModuleType:
    """MinAtar's game module ``minatar/environments/<game>.py``, loaded by path: importing
    ``minatar.environments`` would run ``minatar/__init__``, which imports seaborn."""
    root = _package_dir("minatar")
    path = root / "environments" / f"{game}.py" if root is not None else None
    if path is None or not path.is_file():
        raise gym.error.DependencyNotInstalled(f"MinAtar needs minatar: {ATARI_INSTALL}")
    spec = importlib.util.spec_from_file_location(f"zmqrl._minatar_{game}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class MinAtarEnv(gym.Env):
    """A MinAtar game as a gymnasium env with uint8 [C, 10, 10] observations (0 or 255)."""

    metadata = {"render_modes": []}

    def __init__(self, game: str, sticky_action_prob: float = 0.1,
                 difficulty_ramping: bool = True, minimal_action_set: bool = True):
        self.game = _minatar_game(game).Env(ramping=difficulty_ramping)
        self.sticky_action_prob = sticky_action_prob
        self.actions = (list(self.game.minimal_action_set()) if minimal_action_set
                        else list(range(6)))  # every MinAtar game has 6 raw actions
        h, w, c = self.game.state_shape()
        self.observation_space = gym.spaces.Box(0, 255, (c, h, w), np.uint8)
        self.action_space = gym.spaces.Discrete(len(self.actions))
        self.last_action = 0

    def _obs(self) -> np.ndarray:
        state = self.game.state()  # bool [H, W, C]
        return np.ascontiguousarray(state.transpose(2, 0, 1)).view(np.uint8) * np.uint8(255)

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None:
            # The game draws from its own RandomState (spawns, ball start).
            self.game.random = np.random.RandomState(seed)
        self.game.reset()
        self.last_action = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        a = self.actions[int(action)]
        if self.np_random.random() < self.sticky_action_prob:
            a = self.last_action  # MinAtar's sticky actions: the previous action repeats
        self.last_action = a
        reward, terminal = self.game.act(a)
        return self._obs(), float(reward), bool(terminal), False, {}


# ----- registration ------------------------------------------------------------------------
def _register() -> None:
    for name in atari_games():
        env_id = f"zmqrl/Atari-{name}-v5"
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=make_atari, kwargs={"game": name})
    for name, game in MINATAR_GAMES.items():
        env_id = f"zmqrl/MinAtar-{name}-v1"
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=MinAtarEnv, kwargs={"game": game},
                         max_episode_steps=MINATAR_MAX_STEPS)


_register()
