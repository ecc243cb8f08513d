"""A topology as plain data: its node specs and sections, as the node runtime reads them.

The bottom of the stack: the bus (node runtime, addresses) reads topologies through
these dataclasses. Loading a YAML file, checking it and parsing its sections into the
parts' configs is :mod:`zmqrl.run.topology`, whose ``Topology`` extends
:class:`TopologySpec`.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any

from zmqrl import plugins


@dataclass
class NodeSpec:
    name: str
    kind: str | None = None
    impl: str | None = None
    command: list[str] | None = None
    binds: dict[str, str] = field(default_factory=dict)  # only for command nodes
    replicas: int = 1
    args: dict[str, Any] = field(default_factory=dict)
    # link -> "node.port"; a list of them for a link declared ``many`` (zmqrl.bus.node.Link)
    links: dict[str, str | list[str]] = field(default_factory=dict)
    host: str | None = None
    cores: list[int] = field(default_factory=list)  # zmqrl.bus.cores
    resources: dict[str, Any] = field(default_factory=dict)  # {cpus, gpus, custom}
    restart: str = "on-failure"
    max_restarts: int = 5

    @property
    def target(self) -> str | None:
        """The "module:Class" that implements this node (None for a command)."""
        return self.impl or (plugins.import_path("node", self.kind) if self.kind else None)

    def targets(self, link: str) -> list[str]:
        """The "node.port" targets of ``link``, in order: one for a plain link, each of
        a many-link's list; none where the link is not given."""
        value = self.links.get(link)
        if value is None:
            return []
        return [value] if isinstance(value, str) else list(value)

    def links_to(self, link: str, target: str) -> bool:
        """Whether ``link`` names ``target`` ("node.port"), alone or in its list."""
        return target in self.targets(link)

    def all_targets(self) -> list[str]:
        """Every target of every link, in link order (a many-link's each)."""
        return [t for link in self.links for t in self.targets(link)]


@dataclass
class TopologySpec:
    """A topology as plain data: what the node runtime reads. Loading and checking it,
    and the configs parsed from it, are :mod:`zmqrl.run.topology`'s (``Topology``)."""

    name: str
    env: dict[str, Any]
    nodes: dict[str, NodeSpec]
    model: dict[str, Any] = field(default_factory=dict)
    algo: dict[str, Any] = field(default_factory=dict)  # as written; see algo_config
    seed: int = 0
    network: dict[str, Any] = field(default_factory=dict)
    source: str = "<topology>"
    import_paths: list[str] = field(default_factory=list)  # absolute; see load_class
    self_play: dict[str, Any] | None = None  # as written; see acting
    # The parts an architecture is made of, where not its algorithm's defaults
    # (zmqrl.parts: behaviour, items, source, updater)
    parts: dict[str, Any] = field(default_factory=dict)
    expect: dict[str, Any] = field(default_factory=dict)  # what a test run must reach

    def to_dict(self) -> dict[str, Any]:
        """The resolved topology, as written into a run directory."""
        nodes = {}
        for spec in self.nodes.values():
            d = {k: v for k, v in dataclasses.asdict(spec).items() if v not in (None, {}, [])}
            d.pop("name")
            nodes[spec.name] = d
        out = {"name": self.name, "seed": self.seed, "env": self.env, "model": self.model,
               "algo": self.algo, "nodes": nodes}
        if self.network:
            out["network"] = self.network
        if self.import_paths:
            out["import_paths"] = self.import_paths
        if self.self_play is not None:
            out["self_play"] = self.self_play
        for key in ("parts", "expect"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out


def load_class(target: str, import_paths: list[str] | tuple[str, ...] = ()) -> type:
    """The class ``module:Class`` names. ``import_paths`` are searched after the
    installed packages, so a user's ``impl: myactor:MyActor`` beside the topology file
    loads without PYTHONPATH (and cannot shadow an installed module)."""
    plugins.add_import_paths(import_paths)
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def ports_of(spec: NodeSpec) -> dict[str, str]:
    """Bound ports of a node: port name -> socket kind."""
    if spec.command is not None:
        return dict(spec.binds)
    return dict(load_class(spec.target).binds)
