"""What a run asks of a cluster: one placement-group bundle per node replica.

A node's ``resources: {cpus, gpus, custom: {name: amount}}`` is what each of its
replicas needs (default: one CPU); a node with ``host:`` is also pinned to the Ray node
with that address (Ray's ``node:<ip>`` resource). Pure functions, no Ray: the engine
turns these into a placement group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zmqrl.bus.labels import label as make_label
from zmqrl.run.topology import Topology

DEFAULT_CPUS = 1.0
# Ray's placement strategies by the name `up --strategy` takes.
STRATEGIES = {"pack": "PACK", "spread": "SPREAD", "strict-pack": "STRICT_PACK",
              "strict-spread": "STRICT_SPREAD"}
# A sliver of a node's own resource pins a bundle there without using it up.
_PIN = 0.001


@dataclass(frozen=True)
class Slot:
    """One node replica and the bundle it is placed in."""

    node: str
    replica: int
    label: str
    bundle: dict[str, float]

    def actor_options(self) -> dict[str, Any]:
        """``num_cpus``/``num_gpus``/``resources`` of the actor that takes the whole
        bundle (so Ray accounts the node process's use, and sets CUDA_VISIBLE_DEVICES)."""
        custom = {k: v for k, v in self.bundle.items() if k not in ("CPU", "GPU")}
        return {"num_cpus": self.bundle.get("CPU", 0.0), "num_gpus": self.bundle.get("GPU", 0.0),
                "resources": custom}


def bundle(resources: dict[str, Any], host: str | None = None) -> dict[str, float]:
    """One replica's Ray bundle from its topology ``resources`` (and ``host``)."""
    out: dict[str, float] = {"CPU": float(resources.get("cpus", DEFAULT_CPUS))}
    if resources.get("gpus"):
        out["GPU"] = float(resources["gpus"])
    for name, amount in (resources.get("custom") or {}).items():
        if amount:
            out[str(name)] = float(amount)
    if host:
        out[f"node:{host}"] = _PIN
    out = {k: v for k, v in out.items() if v > 0}
    # Ray refuses an empty bundle; a node asking for nothing still takes a sliver of CPU.
    return out or {"CPU": _PIN}


def slots(topo: Topology) -> list[Slot]:
    """Every node replica of ``topo`` in a fixed order (bundle i is slot i)."""
    return [Slot(name, replica, make_label(name, replica, spec.replicas),
                 bundle(spec.resources, spec.host))
            for name, spec in topo.nodes.items() for replica in range(spec.replicas)]


def totals(bundles: list[dict[str, float]]) -> dict[str, float]:
    """What all ``bundles`` need together (for the error when a cluster lacks it)."""
    out: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            out[k] = out.get(k, 0.0) + v
    return out
