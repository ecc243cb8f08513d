"""Who a population league rates when it cannot rate everyone: a pure policy, no I/O.

The K members' current policies always have a place. Non-members (snapshots, anyone a
peer names) share the rest of the ``cap``; a batch of games that names more new players
than there is room for first evicts the least recently seen non-members it does not
name, and the new players that still do not fit are refused (their games are skipped).
Non-members idle since a moment are forgotten. So made-up names can neither fill the
league for good nor keep the members' games out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping


def make_room(named: Iterable[str], held: Collection[str], members: Collection[str],
              last_seen: Mapping[str, float], cap: int) -> tuple[list[str], set[str]]:
    """``(evicted, refused)`` for a batch naming ``named`` when ``held`` are rated:
    the held non-members to drop, least recently seen first, and the new non-members
    that still do not fit."""
    named = list(named)
    new = [name for name in named if name not in held and name not in members]
    room = cap - len(members) - sum(1 for name in held if name not in members)
    evicted: list[str] = []
    if len(new) > room:
        keep = set(named)
        evictable = sorted((last_seen.get(name, 0.0), name) for name in held
                           if name not in members and name not in keep)
        evicted = [name for _, name in evictable[:len(new) - room]]
        room += len(evicted)
    return evicted, set(new[max(room, 0):])


def idle(held: Iterable[str], members: Collection[str], last_seen: Mapping[str, float],
         since: float) -> list[str]:
    """The non-members no game named after ``since``."""
    return [name for name in held if name not in members
            and last_seen.get(name, since) <= since]
