"""The run's registry: a named Ray actor where node replicas publish their addresses.

A node's wrapper (:mod:`zmqrl.run.engines.ray_host`) picks its ports on the host Ray placed
it on, registers them here with its server public key, and looks up the addresses of
the nodes it links to before starting its node: a lookup waits (asynchronously, so
other calls go on) until every replica it needs has registered, or says which are
missing when the deadline passes. An address is claimed by one replica only, so two
wrappers on one host never share a port. Only small strings pass through here:
parameters and experience never touch Ray.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Registry:
    """label -> {"ip", "addresses": {port: address}, "key": z85 str or None}."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[str, Any]] = {}
        self._owner: dict[str, str] = {}  # address -> label that claimed it
        self._changed = asyncio.Condition()

    async def register(self, label: str, ip: str, addresses: dict[str, str],
                       key: str | None) -> list[str]:
        """Publish ``label``'s addresses; returns those another replica holds (then
        nothing is registered: pick other ports and try again)."""
        taken = [a for a in addresses.values() if self._owner.get(a, label) != label]
        if taken:
            return taken
        old = self._entries.get(label)
        for address in (old or {}).get("addresses", {}).values():
            self._owner.pop(address, None)
        for address in addresses.values():
            self._owner[address] = label
        async with self._changed:
            self._entries[label] = {"ip": ip, "addresses": dict(addresses), "key": key}
            self._changed.notify_all()
        return []

    async def previous(self, label: str) -> dict[str, Any] | None:
        """What ``label`` registered last (a wrapper placed again keeps its ports)."""
        return self._entries.get(label)

    async def lookup(self, labels: list[str], timeout_s: float) -> dict[str, Any]:
        """``{"entries": {label: entry}, "missing": [labels not registered in time]}``."""
        def ready() -> bool:
            return all(label in self._entries for label in labels)

        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(ready), timeout_s)
            except asyncio.TimeoutError:
                pass
        return {"entries": {lb: self._entries[lb] for lb in labels if lb in self._entries},
                "missing": [lb for lb in labels if lb not in self._entries]}

    async def table(self) -> dict[str, dict[str, Any]]:
        return dict(self._entries)
