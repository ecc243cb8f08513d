"""Topology files: load YAML, check it thoroughly, and hand back plain dataclasses.

A topology names the env, model and algorithm once, then its nodes: each has a ``kind``
(a node in ``nodes/``), or ``impl: module:Class`` (any Node subclass), or ``command``
(any program that speaks the wire protocol), plus ``replicas``, ``args`` and ``links``
(``{link_name: "node.port"}``, or a list of them for a link its class declares ``many``:
zmqrl.bus.node.Link). Every problem is reported at once, each naming the
file, the node and the field.

Paths in a topology file (``network.curve.keys``) are relative to the file's directory;
:func:`load` makes them absolute, so the resolved topology a run directory holds still
names the same files.
"""

from __future__ import annotations

import copy
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from zmqrl import plugins
from zmqrl.bus import cores, messages, security
from zmqrl.bus.spec import NodeSpec, TopologySpec, load_class, ports_of  # noqa: F401
from zmqrl.parts import algo_config
from zmqrl.parts.selfplay import config as selfplay_config
from zmqrl.parts.selfplay.config import SelfPlayConfig

# A node's `kind` is a short name registered in the `zmqrl.nodes` entry-point group
# (zmqrl's own nodes: its pyproject.toml; zmqrl.plugins); `impl: module:Class` names any
# other Node subclass.
RESTART_POLICIES = ("always", "on-failure", "never")
# Which socket a link's socket may connect to.
_COMPATIBLE = {"dealer": "router", "sub": "pub", "push": "pull"}

_NAME = r"^[A-Za-z][A-Za-z0-9_]*$"
_TARGET = {"type": "string", "pattern": r"^\w+\.\w+$"}  # a link's "node.port"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "env", "nodes"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": r"^[A-Za-z0-9_.-]+$"},
        "seed": {"type": "integer"},
        # Where `impl: module:Class` modules are looked for besides the installed
        # packages; the topology file's directory and the working directory always are.
        "import_paths": {"type": "array", "items": {"type": "string"}},
        "env": {
            "type": "object",
            "required": ["id"],
            "additionalProperties": False,
            "properties": {"id": {"type": "string"}, "kwargs": {"type": "object"},
                           # the largest magnitude of an observation, reward or action
                           # any port accepts (zmqrl.bus.messages: rule "bounded")
                           "max_abs_value": {"type": "number", "exclusiveMinimum": 0}},
        },
        "model": {"type": "object", "properties": {"kind": {"type": "string"}}},
        # PBT: K members of every node but the controller (zmqrl/run/population.py expands
        # it before the checks below, which then see ordinary nodes)
        "population": {"type": "object"},
        # self-play against a pool of past policies (zmqrl/parts/selfplay/config.py)
        "self_play": {"type": "object"},
        # The parts of the architecture where not its algorithm's defaults: registered
        # names or module:Name import paths (zmqrl.parts.algo_config.Parts, zmqrl.plugins)
        "parts": {
            "type": "object",
            "additionalProperties": False,
            "properties": {name: {"type": "string", "minLength": 1} for name in
                           ("behaviour", "gradient_behaviour", "items", "source", "updater",
                            "surgery")},
        },
        # What a run of this topology must reach, read by the tests (tests/expect.py)
        "expect": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                # mean return of the last 100 episodes; omitted or null: runs only
                "return": {"type": ["number", "null"]},
                "seconds": {"type": "number", "exclusiveMinimum": 0},  # bounds a failing run
                "min_updates": {"type": "integer", "minimum": 0},
                "set": {"type": "array", "items": {"type": "string"}},  # --set for the test
                # where this file is run instead (a long or pixel run), with why
                "tested_by": {"type": "string"},
                # the return takes minutes to reach: asked on request (ZMQRL_LONG_TESTS=1);
                # otherwise the run goes `seconds_short` and must move data and update
                "long": {"type": "boolean"},
                "seconds_short": {"type": "number", "exclusiveMinimum": 0},
            },
        },
        "algo": {"type": "object", "properties": {"kind": {"type": "string"}}},
        "network": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "base_port": {"type": "integer", "minimum": 1024, "maximum": 65000},
                "max_message_bytes": {"type": "integer", "minimum": 1024},
                # peer liveness (node.py): ping a silent link peer after heartbeat_s,
                # declare it dead after peer_timeout_s (the supervisor uses it too)
                "heartbeat_s": {"type": "number", "exclusiveMinimum": 0},
                "peer_timeout_s": {"type": "number", "exclusiveMinimum": 0},
                # CURVE on every tcp endpoint; keys: a directory made by `zmqrl keys`
                "curve": {
                    "type": "object",
                    "required": ["keys"],
                    "additionalProperties": False,
                    "properties": {"keys": {"type": "string", "minLength": 1}},
                },
            },
        },
        "nodes": {
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"pattern": _NAME},
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "kind": {"type": "string"},
                    "impl": {"type": "string", "pattern": r"^[\w.]+:\w+$"},
                    "command": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    "binds": {
                        "type": "object",
                        "additionalProperties": {"enum": ["router", "pub", "pull"]},
                    },
                    "replicas": {"type": "integer", "minimum": 1},
                    "args": {"type": "object"},
                    "links": {
                        "type": "object",
                        # a list only for a link declared many (checked with its class)
                        "additionalProperties": {"anyOf": [
                            _TARGET, {"type": "array", "items": _TARGET, "minItems": 1}]},
                    },
                    "host": {"type": "string"},
                    # One core per replica for its main thread, kept free of every other
                    # thread of the run on that host (zmqrl/bus/cores.py).
                    "cores": {"type": "array", "items": {"type": "integer", "minimum": 0},
                              "minItems": 1},
                    # What one replica needs where an engine places it (`up --engine
                    # ray`: one placement-group bundle per replica); `up` ignores it.
                    "resources": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "cpus": {"type": "number", "minimum": 0},
                            "gpus": {"type": "number", "minimum": 0},
                            "custom": {"type": "object",
                                       "additionalProperties": {"type": "number",
                                                                "minimum": 0}},
                        },
                    },
                    "restart": {"enum": list(RESTART_POLICIES)},
                    "max_restarts": {"type": "integer", "minimum": 0},
                },
                "oneOf": [
                    {"required": ["kind"]},
                    {"required": ["impl"]},
                    {"required": ["command"]},
                ],
            },
        },
    },
}


class TopologyError(ValueError):
    """Raised with every problem found; ``errors`` holds one line per problem."""

    def __init__(self, errors: list[str]):
        super().__init__("\n".join(errors))
        self.errors = errors


@dataclass
class Topology(TopologySpec):
    """A loaded, checked topology: the plain data and what is parsed from it once."""

    @functools.cached_property
    def acting(self) -> SelfPlayConfig | None:
        """The topology's acting choice beyond its algorithm's family: the ``self_play``
        section parsed (defaults filled in), or None. ``zmqrl.parts.acting.behaviour_for``
        takes it; parsed once, when the topology loads."""
        return SelfPlayConfig.parse(self.self_play)

    @functools.cached_property
    def parts_config(self) -> algo_config.Parts:
        """The parts the architecture is made of: the algorithm's defaults, with the
        ``parts`` section's choices in their place."""
        return algo_config.Parts.of(self.algo_config, self.parts)

    @functools.cached_property
    def algo_config(self) -> algo_config.AlgoConfig:
        """The ``algo`` section parsed into its algorithm's dataclass (defaults filled in):
        what every node reads. Parsed once, when the topology loads."""
        return algo_config.parse(self.algo)

    def env_spec(self) -> Any:
        """The env's spaces (``zmqrl.parts.envs.EnvSpec``): makes the env once."""
        from zmqrl.parts.envs import env_spec

        return env_spec(self.env)


def load(path: str | Path, overrides: dict[str, Any] | None = None, *,
         node: str | None = None) -> Topology:
    """Read, check and return a topology; raise :class:`TopologyError` listing every problem.

    With ``node``, check what the process running that node needs (see :func:`from_dict`).
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise TopologyError([f"{path}: no such file"]) from None
    except yaml.YAMLError as exc:
        raise TopologyError([f"{path}: not valid YAML: {exc}"]) from None
    # A path in the file is relative to the file; one given on the command line
    # (--set network.curve.keys=...) to the working directory.
    _absolute_paths(raw, path.parent)
    _add_import_paths(raw, path.parent)
    if overrides:
        overrides = copy.deepcopy(overrides)
        _absolute_paths(overrides, Path.cwd())
        raw = merge(raw, overrides)
    return from_dict(raw, str(path), node=node)


def _absolute_paths(raw: Any, base: Path) -> None:
    """Make ``network.curve.keys`` absolute, relative to ``base`` (in place)."""
    curve = raw.get("network") if isinstance(raw, dict) else None
    curve = curve.get("curve") if isinstance(curve, dict) else None
    keys = curve.get("keys") if isinstance(curve, dict) else None
    if isinstance(keys, str) and keys:
        curve["keys"] = os.path.abspath(base / os.path.expanduser(keys))


def _add_import_paths(raw: Any, base: Path) -> None:
    """Make ``import_paths`` absolute (relative to ``base``) and add ``base`` and the
    working directory, in place; a malformed value is left for the schema to report."""
    given = raw.get("import_paths", []) if isinstance(raw, dict) else None
    if isinstance(given, list) and all(isinstance(p, str) for p in given):
        paths = [os.path.abspath(base / p) for p in given]
        raw["import_paths"] = list(dict.fromkeys([*paths, os.path.abspath(base), os.getcwd()]))


def merge(base: Any, overrides: dict[str, Any]) -> Any:
    """Deep-merge ``overrides`` into a copy of ``base`` (dicts merge, anything else replaces)."""
    out = copy.deepcopy(base) if isinstance(base, dict) else {}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def from_dict(raw: Any, source: str = "<topology>", *, node: str | None = None) -> Topology:
    """The topology ``raw`` describes, checked; :class:`TopologyError` lists every problem.

    With ``node`` (``zmqrl node``: one node's process), the other nodes' specs, the env
    and the model go unchecked: ``up`` and ``validate`` check those, and building the
    model would load torch into a node that runs none (a remote actor, the replay). Every
    node's class is still imported, for the ports its links connect to.
    """
    from zmqrl.run import population
    # Every part named by import path is looked for in the topology's directory and its
    # import_paths too (zmqrl.plugins), the population's nodes included.
    given = raw.get("import_paths") if isinstance(raw, dict) else None
    if isinstance(given, list):
        plugins.add_import_paths(p for p in given if isinstance(p, str))
    try:
        raw = population.expand(raw)
    except ValueError as exc:
        raise TopologyError([f"{source}: {exc}"]) from None
    schema_errors = _schema_errors(raw)
    # Semantic checks still run on every node the schema had nothing against, so one
    # pass reports every problem.
    broken = {str(path[1]) for path, _ in schema_errors if len(path) >= 2 and path[0] == "nodes"}
    nodes_raw = raw.get("nodes") if isinstance(raw, dict) else None
    nodes = {}
    if isinstance(nodes_raw, dict):
        nodes = {name: NodeSpec(name=name, **body) for name, body in nodes_raw.items()
                 if name not in broken and isinstance(body, dict)}
    if any(len(path) < 2 or path[0] != "nodes" for path, _ in schema_errors):
        nodes = {}  # the file's overall shape is wrong; node checks would only add noise
    topo = Topology(
        name=raw.get("name", "") if isinstance(raw, dict) else "",
        env=raw.get("env", {}) if isinstance(raw, dict) else {},
        nodes=nodes,
        model=raw.get("model", {}) if isinstance(raw, dict) else {},
        algo=raw.get("algo", {}) if isinstance(raw, dict) else {},
        seed=raw.get("seed", 0) if isinstance(raw, dict) else 0,
        network=raw.get("network", {}) if isinstance(raw, dict) else {},
        source=source,
        import_paths=raw.get("import_paths", []) if isinstance(raw, dict) else [],
        self_play=raw.get("self_play") if isinstance(raw, dict) else None,
        parts=raw.get("parts", {}) if isinstance(raw, dict) else {},
        expect=raw.get("expect", {}) if isinstance(raw, dict) else {},
    )
    errors = [(path, msg) for path, msg in schema_errors]
    kind = topo.algo.get("kind") if isinstance(topo.algo, dict) else None
    if type(kind) is str:
        try:  # the message sets its algorithm names, and no other (zmqrl.bus.messages.use)
            messages.use(getattr(algo_config.config_type(kind), "messages", ()))
        except ValueError:
            pass  # an unknown algorithm: the checks below name it
    errors += _semantic_errors(topo, broken, node)
    if errors:
        raise TopologyError([f"{source}: {_where(path)}: {msg}" for path, msg in errors])
    topo.algo_config  # noqa: B018  (parsed now: every node reads the same config)
    topo.parts_config  # noqa: B018
    topo.acting  # noqa: B018
    return topo


def _where(path: Any) -> str:
    parts = [str(p) for p in path]
    if len(parts) >= 2 and parts[0] == "nodes":
        return f"node '{parts[1]}'" + (f", field '{'.'.join(parts[2:])}'" if parts[2:] else "")
    return f"field '{'.'.join(parts)}'" if parts else "top level"


def _schema_errors(raw: Any) -> list[tuple[tuple, str]]:
    validator = jsonschema.Draft202012Validator(SCHEMA)
    out = []
    for err in sorted(validator.iter_errors(raw), key=lambda e: list(map(str, e.absolute_path))):
        if err.validator == "oneOf":
            given = [k for k in ("kind", "impl", "command") if k in (err.instance or {})]
            msg = ("needs exactly one of 'kind', 'impl' or 'command'"
                   + (f" (has {', '.join(given)})" if given else ""))
        elif err.validator == "additionalProperties" and not err.absolute_path:
            msg = err.message.replace("Additional properties", "unknown top-level field(s)")
        elif err.validator == "anyOf" and list(err.absolute_path)[2:3] == ["links"]:
            msg = (f"{err.instance!r} is neither a 'node.port' target nor a non-empty list "
                   "of them")
        else:
            msg = err.message
        out.append((tuple(err.absolute_path), msg))
    return out


def _semantic_errors(topo: Topology, broken: set[str],
                     node: str | None = None) -> list[tuple[tuple, str]]:
    errors: list[tuple[tuple, str]] = []
    classes: dict[str, type] = {}
    for spec in topo.nodes.values():
        if spec.kind is not None and spec.target is None:
            errors.append((("nodes", spec.name, "kind"),
                           f"unknown kind '{spec.kind}' (known: "
                           f"{', '.join(plugins.names('node'))}; or use impl: module:Class)"))
        elif spec.target:
            try:
                classes[spec.name] = load_class(spec.target, topo.import_paths)
            except (ImportError, AttributeError) as exc:
                errors.append((("nodes", spec.name, "impl"),
                               f"cannot load {spec.target}: {exc}"))
    for spec in topo.nodes.values():
        if node is not None and spec.name != node:
            continue  # another node: `up` and `validate` check it (see from_dict)
        cls = classes.get(spec.name)
        if cls is not None:
            args_type = getattr(cls, "Args", None)
            arg_errors = [(("nodes", spec.name, "args", key), msg) for key, msg in
                          algo_config.field_type_errors(args_type, spec.args, cls.__name__)]
            errors += arg_errors or cls.check_spec(spec, topo)
            for link in sorted(set(cls.links) - set(spec.links)):
                if cls.links[link].required:
                    errors.append((("nodes", spec.name, "links"),
                                   f"missing required link '{link}'"))
        for link, given in spec.links.items():
            where = ("nodes", spec.name, "links", link)
            if cls is not None and link not in cls.links:
                errors.append((where, f"{cls.__name__} has no link '{link}' "
                                      f"(it has: {', '.join(cls.links) or 'none'})"))
                continue
            if isinstance(given, list) and cls is not None and not cls.links[link].many:
                errors.append((where, f"link '{link}' takes one target (node.port), "
                                      "not a list"))
                continue
            # A command node's links are its own business: a list is taken as given.
            for i, target in enumerate([given] if isinstance(given, str) else given):
                errors += _target_errors(topo, classes, broken, cls, link, target,
                                         where if isinstance(given, str) else (*where, i))
    errors += cores.errors(topo)
    errors += _rendezvous_errors(topo, classes)
    errors += _algo_errors(topo.algo)
    errors += _self_play_errors(topo)
    errors += _env_model_errors(topo) if node is None else []
    errors += _network_errors(topo.network)
    return errors


def _target_errors(topo: Topology, classes: dict[str, type], broken: set[str],
                   cls: type | None, link: str, target: str,
                   where: tuple) -> list[tuple[tuple, str]]:
    """What is wrong with one target ("node.port") of ``link``: a node that is not
    there, a port it does not bind, a socket the link's cannot connect to."""
    node_name, _, port = target.partition(".")
    if node_name in broken:
        return []  # that node's own errors are already reported
    if node_name not in topo.nodes:
        return [(where, f"'{target}' names no node '{node_name}' "
                        f"(nodes: {', '.join(sorted({*topo.nodes, *broken}))})")]
    if node_name in classes:
        ports = dict(classes[node_name].binds)
    elif topo.nodes[node_name].command is not None:
        ports = dict(topo.nodes[node_name].binds)
    else:
        return []  # the target's kind is unknown; reported with it
    if port not in ports:
        return [(where, f"node '{node_name}' binds no port '{port}' "
                        f"(it binds: {', '.join(ports) or 'nothing'})")]
    if cls is not None and _COMPATIBLE[cls.links[link].socket] != ports[port]:
        return [(where, f"a {cls.links[link].socket} link cannot connect to "
                        f"'{target}', a {ports[port]} port")]
    return []


def _rendezvous_errors(topo: Topology, classes: dict[str, type]) -> list[tuple[tuple, str]]:
    """Data-parallel learner nodes with ``host:`` meet on one loopback port per machine
    (:func:`zmqrl.bus.endpoints.rendezvous_port`): two on one host would collide."""
    from zmqrl.bus import roles
    from zmqrl.bus.endpoints import rendezvous_port

    errors: list[tuple[tuple, str]] = []
    first_on: dict[str, str] = {}  # host -> the first such node on it
    for name in sorted(topo.nodes):
        spec = topo.nodes[name]
        if not (spec.host and spec.replicas > 1 and "param_server" not in spec.links
                and getattr(classes.get(name), "role", None) == roles.LEARNS):
            continue
        other = first_on.setdefault(spec.host, name)
        if other != name:
            errors.append((("nodes", name, "host"),
                           f"data-parallel learners '{other}' and '{name}' on host "
                           f"{spec.host} would both meet on port {rendezvous_port(topo)} "
                           "(network.base_port - 1): put them on different hosts or "
                           "make them one node"))
    return errors


def _env_model_errors(topo: Topology) -> list[tuple[tuple, str]]:
    """Make the env once and build the model for it, so that an unknown env id, a
    model that does not fit the env (a Q-network for continuous actions) or a bad model
    option is reported here, not as a crash loop of every node at start."""
    import gymnasium as gym  # heavy, and only needed here

    from zmqrl.parts.envs import env_spec
    from zmqrl.parts.models import build_model

    env_id = topo.env.get("id")
    if not isinstance(env_id, str):
        return []  # the schema reports it
    try:
        spec = env_spec(topo.env)
    except gym.error.Error as exc:
        return [(("env", "id"), f"'{env_id}': {exc}")]
    except (ValueError, TypeError) as exc:
        return [(("env",), f"'{env_id}': {exc}")]
    try:
        model = build_model(topo.model, spec, algo=topo.algo_config)
    except (ValueError, TypeError) as exc:
        return [(("model",), str(exc))]
    # The model keeps its interface's contract (methods, and the shapes of a forward
    # pass on a dummy batch): a broken one is named here, not minutes into a run.
    from zmqrl.parts.models.interfaces import check_model

    interface = getattr(model, "interface", None)
    if interface:
        problems = check_model(interface, model, spec)
        if problems:
            return [(("model", "kind"), problem) for problem in problems]
    from zmqrl.run import contracts  # the parts' protocols: imports torch-side parts
    return contracts.errors(topo)


def _network_errors(network: dict[str, Any]) -> list[tuple[tuple, str]]:
    directory = security.configured_dir(network)
    if directory is None:
        return []
    return [(("network", "curve", "keys"), problem)
            for problem in security.check_key_dir(directory)]


def _self_play_errors(topo: Topology) -> list[tuple[tuple, str]]:
    try:
        family = algo_config.config_type(topo.algo.get("kind", algo_config.DEFAULT_KIND)).family
    except ValueError:
        family = None  # reported with the algo section
    return selfplay_config.errors(topo.self_play, topo.env, family)


def _algo_errors(algo: dict[str, Any]) -> list[tuple[tuple, str]]:
    return [(("algo", key), msg) for key, msg in algo_config.errors(algo)]
