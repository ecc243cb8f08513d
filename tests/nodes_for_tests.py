"""Node classes that misbehave on purpose, swapped into topologies with ``impl:``."""

from __future__ import annotations

from nodes.actor import Actor


class CrashingActor(Actor):
    def setup(self) -> None:
        raise RuntimeError("crashing on purpose")
