"""The one place a node replica's label is made.

A label is the node name, or ``name.replica`` when the node has more than one replica
(``actor.1``); Procfile process names use ``_`` instead of ``.`` (``actor_1``)."""

from __future__ import annotations


def label(name: str, replica: int, replicas: int, sep: str = ".") -> str:
    return name if replicas == 1 else f"{name}{sep}{replica}"
