"""The topology's optional ``self_play`` section, parsed once into :class:`SelfPlayConfig`
(defaults here only), and what ``zmqrl validate`` checks about it.

A topology with the section acts through the self-play behaviour
(``zmqrl.parts.selfplay.acting``, chosen by ``zmqrl.parts.acting.behaviour_for``): every env is a
game between the learner's policy and an opponent drawn per episode from a pool of its
past snapshots. It needs a two-player OpenSpiel game env whose every step is the move of
whoever is to play (``env.kwargs.opponent: self``) and an actor-critic (``unroll``)
algorithm. No torch here: the topology loader reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from zmqrl.parts.algo_config import UNROLL, field_type_errors

SECTION = "self_play"


@dataclass(frozen=True)
class SelfPlayConfig:
    """Knobs of self-play with an opponent pool (OpenAI Five's defaults where it has one)."""

    behaviour: ClassVar[str] = "self_play"  # a registered behaviour (zmqrl.plugins)
    family: ClassVar[str] = UNROLL  # what the behaviour ships: unrolls of the learner's moves
    snapshot_every: int = 20  # parameter versions between snapshots of the policy
    pool_size: int = 20  # snapshots kept (the newest)
    latest_fraction: float = 0.8  # episodes against the latest policy; else a past snapshot

    @classmethod
    def field_errors(cls, values: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(field, message) for unknown keys, wrong types and values out of range."""
        found = field_type_errors(cls, values, SECTION)
        mistyped = {key for key, _ in found}
        rules = {"snapshot_every": (lambda x: x >= 1, "must be >= 1"),
                 "pool_size": (lambda x: x >= 1, "must be >= 1"),
                 "latest_fraction": (lambda x: 0 <= x <= 1, "must be in [0, 1]")}
        return found + [(key, f"{values[key]!r}: {message}")
                        for key, (ok, message) in rules.items()
                        if key in values and key not in mistyped and not ok(values[key])]

    @classmethod
    def parse(cls, values: Mapping[str, Any] | None) -> SelfPlayConfig | None:
        """The section's config, defaults filled in; None when the topology has none."""
        if values is None:
            return None
        return cls(**dict(values))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def errors(section: Any, env: Mapping[str, Any], family: str | None
           ) -> list[tuple[tuple, str]]:
    """(field path, message) for every problem of a topology's ``self_play`` section:
    its own fields, an env that is not a self-played game, an algorithm that does not
    learn from unrolls."""
    if section is None:
        return []
    if not isinstance(section, Mapping):
        return [((SECTION,), "must be a mapping of knobs (or {} for the defaults)")]
    found: list[tuple[tuple, str]] = [((SECTION, key), msg)
                                      for key, msg in SelfPlayConfig.field_errors(section)]
    from zmqrl.parts.games import REGISTERED, game_name  # registers the game ids; no open_spiel

    try:
        game = game_name(dict(env))
    except ValueError as exc:
        found.append((("env", "id"), f"self_play plays a two-player game: {exc}"))
    else:
        if game not in REGISTERED:
            # whose move it is is tracked by strict alternation, checked on the board's
            # canonical planes: known for these games only
            found.append((("env", "kwargs", "game"),
                          f"self_play plays games that alternate strictly on a known board "
                          f"({', '.join(REGISTERED)}), not '{game}'"))
        if dict(env.get("kwargs") or {}).get("opponent") != "self":
            found.append((("env", "kwargs", "opponent"),
                          "self_play needs 'opponent: self' (every step is the move of whoever "
                          "is to play; the behaviour picks the opponent)"))
    if family is not None and family != SelfPlayConfig.family:
        found.append((("algo", "kind"), f"self_play trains an actor-critic on unrolls "
                                        f"(vtrace, a2c, ppo), not a '{family}' algorithm"))
    return found
