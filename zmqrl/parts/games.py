"""OpenSpiel games as a source of observations, legal moves and outcomes (``open_spiel``,
``pip install 'zmqrl[games]'``).

Two views of one game, both built on :class:`Game`:

* :class:`Game` itself, a thin adapter over a ``pyspiel`` game for search: states are
  pyspiel states (``clone``, ``apply_action``), and the adapter turns one into what the
  network sees (:meth:`Game.observation`), its legal-action mask and its outcome. MCTS
  (``zmqrl.parts.search``) needs to copy and step states freely, which a gymnasium env does
  not offer, so search works on this adapter, not on an env.
* :class:`GameEnv`, a gymnasium env registered as ``zmqrl/OpenSpiel-<game>-v0``
  (``tic_tac_toe``, ``connect_four``), so that a game is an env id like any other: every
  node learns the observation shape and the action count from it (``zmqrl.parts.envs.env_spec``),
  and any topology can play it. By default the env's other player moves uniformly at
  random (``opponent: random``; the agent's seat is drawn per episode unless ``seat``
  is given), reward +1/0/-1 at the end; ``opponent: self`` makes every step the move of
  whoever is to play, observed from that player's side and rewarded to the player who
  moved (what a self-play behaviour that keeps track of seats needs). An illegal move
  loses the game for whoever made it. ``info`` carries ``legal_mask`` and ``player``.

Observations are from the side of the player to move: for the games with a known plane
layout (tic-tac-toe, connect four) the planes are reordered to [own pieces, opponent's
pieces, empty], so one network plays both seats (AlphaZero's canonical board). Other
games give pyspiel's ``observation_tensor`` of the player to move as it is.

Importing this module registers the env ids; it imports ``pyspiel`` only when a game is
made, so nodes that never make one do not need open_spiel installed.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

GAMES_INSTALL = "pip install 'zmqrl[games]'"
# game -> (plane order for player 0, for player 1): [own, opponent's, empty]. pyspiel's
# tic-tac-toe planes are [empty, nought (player 1), cross (player 0)]; connect four's
# [player 0, player 1, empty].
_PLANES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "tic_tac_toe": ((2, 1, 0), (1, 2, 0)),
    "connect_four": ((0, 1, 2), (1, 0, 2)),
}
REGISTERED = tuple(_PLANES)
# game -> the action each action becomes when the board is mirrored left-right (the
# observation's last axis is the board's columns; the rules do not change).
_MIRRORS: dict[str, tuple[int, ...]] = {
    "tic_tac_toe": (2, 1, 0, 5, 4, 3, 8, 7, 6),
    "connect_four": (6, 5, 4, 3, 2, 1, 0),
}


def env_id(game: str) -> str:
    return f"zmqrl/OpenSpiel-{game}-v0"


def game_name(env_cfg: dict[str, Any]) -> str:
    """The OpenSpiel game behind a topology's ``env`` section (an id of this module);
    ValueError for any other env."""
    env = env_cfg.get("id")
    spec = gym.registry.get(env) if isinstance(env, str) else None
    game = {**(spec.kwargs if spec is not None else {}), **env_cfg.get("kwargs", {})}.get("game")
    if spec is None or spec.entry_point is not GameEnv or not isinstance(game, str):
        raise ValueError(f"env '{env}' is not an OpenSpiel game (one of "
                         f"{', '.join(env_id(g) for g in REGISTERED)})")
    return game


def has_mirror(game: str) -> bool:
    """Whether the game's left-right mirror image is known (:meth:`Game.mirror`)."""
    return game in _MIRRORS


def _observation_buffer(game: Any) -> Any:
    """OpenSpiel's observation buffer for ``game`` (``make_observation``: ``set_from``
    writes a state's tensor into ``.tensor``), if it gives exactly ``observation_tensor``
    on the initial state for every player; else None (the lists are used)."""
    try:
        from open_spiel.python.observation import make_observation

        buffer = make_observation(game)
        state = game.new_initial_state()
        for player in range(game.num_players()):
            buffer.set_from(state, player)
            if not np.array_equal(buffer.tensor,
                                  np.array(state.observation_tensor(player), np.float32)):
                return None
    except Exception:  # an older open_spiel, a game without the default observer
        return None
    return buffer


def _pyspiel() -> Any:
    try:
        import pyspiel
    except ImportError:
        # gymnasium's error for a missing extra: `zmqrl validate` reports it on env.id
        raise gym.error.DependencyNotInstalled(
            f"OpenSpiel games need open_spiel: {GAMES_INSTALL}") from None
    return pyspiel


class Game:
    """One pyspiel game: what the network sees of a state, its legal moves, its outcome.

    ``search`` (default): the game must be what MCTS can search, two-player zero-sum,
    sequential, deterministic, with perfect information."""

    def __init__(self, name: str, search: bool = True):
        pyspiel = _pyspiel()
        self.name = name
        self.game = pyspiel.load_game(name)
        kind = self.game.get_type()
        if search and (self.game.num_players() != 2
                       or kind.utility != pyspiel.GameType.Utility.ZERO_SUM
                       or kind.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL
                       or kind.chance_mode != pyspiel.GameType.ChanceMode.DETERMINISTIC
                       or kind.information != pyspiel.GameType.Information.PERFECT_INFORMATION):
            raise ValueError(f"{name}: search needs a two-player zero-sum sequential "
                             "deterministic game with perfect information")
        self.num_actions = int(self.game.num_distinct_actions())
        self.obs_shape = tuple(int(d) for d in self.game.observation_tensor_shape())
        self.max_length = int(self.game.max_game_length())
        planes = _PLANES.get(name)
        self._planes = None if planes is None else (np.array(planes[0]), np.array(planes[1]))
        self._plane_table = None if planes is None else np.array(planes)  # [player, plane]
        self._buffer = _observation_buffer(self.game)

    def _tensor(self, state: Any, player: int) -> np.ndarray:
        """The state's observation tensor for ``player``, flat float32: written by pyspiel
        into one reused buffer (a view of it: copy before the next call), or, where the
        game has none, built from the list pyspiel returns."""
        if self._buffer is None:
            return np.array(state.observation_tensor(player), np.float32)
        self._buffer.set_from(state, player)
        return self._buffer.tensor

    def new_state(self) -> Any:
        return self.game.new_initial_state()

    def state_from(self, actions: list[int]) -> Any:
        """The state after ``actions`` from the start (a position for tests)."""
        state = self.new_state()
        for action in actions:
            state.apply_action(int(action))
        return state

    def observation(self, state: Any, player: int | None = None) -> np.ndarray:
        """float32 ``obs_shape``: the state seen by ``player`` (default: the player to
        move; a finished game: player 0)."""
        if player is None:
            player = state.current_player()
            if player < 0:
                player = 0
        obs = self._tensor(state, player).reshape(self.obs_shape)
        if self._planes is not None:
            return obs[self._planes[player]]  # (fancy indexing copies)
        return obs.copy()

    def observations(self, states: list[Any], players: np.ndarray) -> np.ndarray:
        """float32 [len(states), *obs_shape]: each state seen by its ``players`` entry
        (what a search's leaves cost: pyspiel writes each into a buffer that is copied
        into its row, ~5x faster on connect four than converting pyspiel's lists)."""
        flat = np.empty((len(states), math.prod(self.obs_shape)), np.float32)
        for i, (state, player) in enumerate(zip(states, players.tolist(), strict=True)):
            flat[i] = self._tensor(state, player)
        obs = flat.reshape(len(states), *self.obs_shape)
        if self._planes is not None:
            obs = obs[np.arange(len(states))[:, None], self._plane_table[players]]
        return obs

    def legal_mask(self, state: Any) -> np.ndarray:
        """bool [num_actions]: the moves the player to move may make."""
        return np.array(state.legal_actions_mask(), np.bool_)

    @property
    def mirrors(self) -> bool:
        """Whether :meth:`mirror` knows this game."""
        return has_mirror(self.name)

    def mirror(self, obs: np.ndarray, policy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions [..., *obs_shape] and their move distributions [..., A] mirrored
        left-right: as good a training position as the original (AlphaGo Zero trained on
        the board's symmetries too)."""
        if self.name not in _MIRRORS:
            raise ValueError(f"{self.name}: no mirror symmetry known (games with one: "
                             f"{', '.join(_MIRRORS)})")
        return (np.ascontiguousarray(obs[..., ::-1]),
                np.ascontiguousarray(policy[..., list(_MIRRORS[self.name])]))


class GameEnv(gym.Env):
    """A game as a gymnasium env (see the module docstring for ``opponent`` and
    ``seat``)."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, game: str, opponent: str = "random", seat: int | None = None,
                 render_mode: str | None = None):
        if opponent not in ("random", "self"):
            raise ValueError(f"opponent must be 'random' or 'self', not {opponent!r}")
        if seat not in (None, 0, 1):
            raise ValueError(f"seat must be 0, 1 or None (drawn per episode), not {seat!r}")
        self.game = Game(game, search=False)
        self.opponent, self.fixed_seat = opponent, seat
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, self.game.obs_shape, np.float32)
        self.action_space = gym.spaces.Discrete(self.game.num_actions)
        self.state: Any = None
        self.seat = 0

    def _info(self) -> dict[str, Any]:
        player = self.state.current_player()
        mask = self.game.legal_mask(self.state) if player >= 0 \
            else np.zeros(self.game.num_actions, np.bool_)
        return {"legal_mask": mask, "player": player}

    def _opponent_moves(self) -> None:
        while not self.state.is_terminal() and self.state.current_player() != self.seat:
            legal = self.state.legal_actions()
            self.state.apply_action(legal[self.np_random.integers(len(legal))])

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.state = self.game.new_state()
        if self.opponent == "random":
            self.seat = self.fixed_seat if self.fixed_seat is not None \
                else int(self.np_random.integers(2))
            self._opponent_moves()
        return self.game.observation(self.state), self._info()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        mover = self.state.current_player()
        action = int(action)
        if action not in self.state.legal_actions():
            # the mover forfeits: a policy must learn the rules too
            info = {**self._info(), "illegal": True}
            return self.game.observation(self.state, mover), -1.0, True, False, info
        self.state.apply_action(action)
        if self.opponent == "random":
            self._opponent_moves()
        done = self.state.is_terminal()
        reward = float(self.state.returns()[mover]) if done else 0.0
        obs = self.game.observation(self.state, mover if done else None)
        return obs, reward, done, False, self._info()

    def render(self) -> str:
        return str(self.state)


def _register() -> None:
    for game in REGISTERED:
        if env_id(game) not in gym.registry:
            # The game's own length bounds every episode: no time limit to add.
            gym.register(env_id(game), entry_point=GameEnv, kwargs={"game": game})


_register()
