"""The registry: every part a topology names, found by short name or import path.

A topology names its parts — the algorithm, the model, the behaviour, the learner's data
source and updater, each node — in one of two ways:

* a **short name** (``dqn``, ``dueling_mlp``, ``epsilon_greedy``): an entry point in the
  part's group (:data:`GROUPS`) of any installed distribution. zmqrl's own parts are
  entry points of zmqrl's ``pyproject.toml``, registered exactly as a plug-in's are, so
  ``pip install`` of a plug-in makes its names work with no import line, and no table
  in the package decides what exists;
* an **import path** ``module:Name`` (``Name`` may be dotted), as gymnasium's
  ``entry_point`` strings: a module beside the topology file (its directory and
  ``import_paths`` are searched after the installed packages) or in any package.

Nothing is imported until a part is resolved, and then only that part's module: the
names of every group are read from the installed distributions' metadata, so a node that
runs no model (a remote actor, the replay, the sink) never loads torch by listing them.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Iterable, Iterator, Mapping
from importlib import metadata
from typing import Any

# part -> entry-point group. What each resolves to:
GROUPS = {
    "algo": "zmqrl.algos",  # the config dataclass (torch-free); it names its learner class
    "model": "zmqrl.models",  # callable (EnvSpec, **options) -> torch.nn.Module
    "behaviour": "zmqrl.behaviours",  # a zmqrl.parts.acting.Behaviour subclass
    "source": "zmqrl.sources",  # a learner's data source class (zmqrl.parts.learning.sources)
    "updater": "zmqrl.updaters",  # a learner's updater class (zmqrl.parts.learning.updaters)
    "node": "zmqrl.nodes",  # a zmqrl.bus.node.Node subclass
    # a zmqrl.bus.messages.MessageSet: an algorithm's own message variants (its replay
    # items, its acting) and their shape symbols
    "messages": "zmqrl.messages",
    # a zmqrl.parts.selfplay.matchmaking.Matchmaker: whom a population member plays next
    "matchmaker": "zmqrl.matchmakers",
    # a zmqrl.parts.surgery.Surgery: how a stopped run's model is carried into a changed
    # one (zmqrl surgery, zmqrl up --resume)
    "surgery": "zmqrl.surgery",
}


# How a message names each part.
_WORDS = {"algo": "algorithm"}


class PluginError(ValueError):
    """A name that resolves to nothing; the message names the part, the name and what
    is known."""


@functools.cache
def _entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    # The first distribution to register a name keeps it, zmqrl's own first: a plug-in
    # cannot silently replace a built-in by reusing its name (it registers another).
    found: dict[str, metadata.EntryPoint] = {}
    for ep in sorted(metadata.entry_points(group=group),
                     key=lambda ep: (getattr(ep.dist, "name", "") != "zmqrl",)):
        found.setdefault(ep.name, ep)
    return found


def names(part: str) -> list[str]:
    """The short names registered for ``part`` (sorted), without importing any."""
    return sorted(_entry_points(GROUPS[part]))


def import_path(part: str, name: str) -> str | None:
    """The ``module:Name`` a short name is registered as (None if it is not), without
    importing it; an import path is returned as it is."""
    if is_import_path(name):
        return name
    ep = _entry_points(GROUPS[part]).get(name)
    return ep.value.replace(" ", "") if ep is not None else None


def add_import_paths(import_paths: Iterable[str]) -> None:
    """Search ``import_paths`` for modules after the installed packages."""
    for directory in import_paths:
        if directory not in sys.path:
            sys.path.append(directory)


def is_import_path(name: str) -> bool:
    return ":" in name


def resolve(part: str, name: str, import_paths: Iterable[str] = ()) -> Any:
    """The object ``name`` stands for as a ``part`` (a key of :data:`GROUPS`): a short
    name's entry point, loaded, or a ``module:Name`` import path, imported with
    ``import_paths`` searched after the installed packages. :class:`PluginError`
    (a ValueError) says what is wrong, naming the part and the name."""
    if not isinstance(name, str) or not name:
        raise PluginError(f"{part}: {name!r} is not a name")
    if is_import_path(name):
        return load_path(name, import_paths, part)
    ep = _entry_points(GROUPS[part]).get(name)
    if ep is None:
        known = names(part)
        hint = "" if known else (" (no zmqrl parts are registered: is zmqrl installed? "
                                 "`pip install -e .` writes its entry points)")
        raise PluginError(f"unknown {_WORDS.get(part, part)} '{name}' (known: "
                          f"{', '.join(known) or 'none'}; "
                          f"or an import path module:Name){hint}")
    try:
        return ep.load()
    except (ImportError, AttributeError) as exc:
        raise PluginError(f"{part} '{name}' ({ep.value}) cannot be loaded: {exc}") from exc


def load_path(target: str, import_paths: Iterable[str] = (), part: str = "part") -> Any:
    """The object ``module:Name`` names (``Name`` may be dotted). ``import_paths`` are
    searched after the installed packages, so a user's module beside the topology file
    loads without PYTHONPATH (and cannot shadow an installed module)."""
    add_import_paths(import_paths)
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise PluginError(f"{part} '{target}': an import path is module:Name")
    try:
        obj: Any = importlib.import_module(module_name)
        for piece in attr.split("."):
            obj = getattr(obj, piece)
    except (ImportError, AttributeError) as exc:
        raise PluginError(f"{part} '{target}' cannot be loaded: {exc}") from exc
    return obj


class Registered(Mapping[str, Any]):
    """The short names registered for a part -> what each resolves to, read-only: what
    exists is what is installed (zmqrl's own and every plug-in's)."""

    def __init__(self, part: str):
        self.part = part

    def __getitem__(self, name: str) -> Any:
        if is_import_path(name) or name not in _entry_points(GROUPS[self.part]):
            raise KeyError(name)
        return resolve(self.part, name)

    def __iter__(self) -> Iterator[str]:
        return iter(names(self.part))

    def __len__(self) -> int:
        return len(names(self.part))
