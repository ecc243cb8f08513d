"""Topology loading and validation: every error names the file, the node and the field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from zmqrl.bus.endpoints import Endpoints
from zmqrl.cli import main
from zmqrl.run.topology import TopologyError, from_dict, load

REPO = Path(__file__).resolve().parents[1]
GOOD = yaml.safe_load((REPO / "topologies" / "seed.yaml").read_text())


def errors_of(mutate) -> list[str]:
    raw = copy.deepcopy(GOOD)
    mutate(raw)
    with pytest.raises(TopologyError) as info:
        from_dict(raw, "t.yaml")
    return info.value.errors


def test_seed_topology_is_valid():
    topo = load(REPO / "topologies" / "seed.yaml")
    assert {"learner", "broker", "actor"} <= set(topo.nodes)
    assert topo.nodes["broker"].links["experience"] == "learner.experience"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda t: t["nodes"]["learner"].update(kind="lerner"),
         "t.yaml: node 'learner', field 'kind': unknown kind 'lerner'"),
        (lambda t: t["nodes"]["actor"]["links"].update(policy="broker.polcy"),
         "t.yaml: node 'actor', field 'links.policy': node 'broker' binds no port 'polcy'"),
        (lambda t: t["nodes"]["actor"]["links"].update(policy="brokr.policy"),
         "t.yaml: node 'actor', field 'links.policy': 'brokr.policy' names no node 'brokr'"),
        (lambda t: t["nodes"]["actor"]["links"].pop("policy"),
         "t.yaml: node 'actor', field 'links': policy: remote needs a 'policy' link"),
        (lambda t: t["nodes"]["learner"].update(links={"replay": "broker.policy"}),
         "t.yaml: node 'learner', field 'links': algo 'vtrace' learns from unrolls"),
        (lambda t: t["nodes"]["actor"]["links"].update(policy="learner.params"),
         "t.yaml: node 'actor', field 'links.policy': a dealer link cannot connect to "
         "'learner.params', a pub port"),
        (lambda t: t["nodes"]["actor"].update(replicas=0),
         "t.yaml: node 'actor', field 'replicas': 0 is less than the minimum of 1"),
        (lambda t: t["nodes"]["actor"].update(replicas="two"),
         "t.yaml: node 'actor', field 'replicas': 'two' is not of type 'integer'"),
        (lambda t: t["nodes"]["actor"]["args"].update(envs="many"),
         "t.yaml: node 'actor', field 'args.envs': 'many' is not int"),
        (lambda t: t["nodes"]["actor"]["args"].update(envz=3),
         "t.yaml: node 'actor', field 'args.envz': unknown for Actor"),
        (lambda t: t["nodes"]["actor"].pop("kind"),
         "t.yaml: node 'actor': needs exactly one of 'kind', 'impl' or 'command'"),
        (lambda t: t["nodes"]["actor"].update(impl="no.such.module:Actor"),
         "t.yaml: node 'actor': needs exactly one of 'kind', 'impl' or 'command' (has kind, impl)"),
        (lambda t: t["nodes"]["learner"].update(colour="red"),
         "t.yaml: node 'learner': Additional properties are not allowed ('colour' was unexpected)"),
        (lambda t: t.pop("env"), "t.yaml: top level: 'env' is a required property"),
        (lambda t: t["algo"].update(lr="fast"), "t.yaml: field 'algo.lr': 'fast' is not float"),
        (lambda t: t["algo"].update(kind="sarsa"),
         "t.yaml: field 'algo.kind': unknown algorithm 'sarsa'"),
        (lambda t: t["env"].update(id="CartPoel-v1"),
         "t.yaml: field 'env.id': 'CartPoel-v1': Environment `CartPoel` doesn't exist"),
        (lambda t: t["model"].update(hiden=[8]),
         "t.yaml: field 'model': model (mlp): ActorCritic.__init__() got an unexpected "
         "keyword argument 'hiden'"),
        (lambda t: t["model"].update(kind="lstm_q", squash="tanh"),
         "t.yaml: field 'model': model (lstm_q)"),
        (lambda t: t.update(env={"id": "InvertedPendulum-v5"}, model={"kind": "dueling_mlp"}),
         "t.yaml: field 'model': model dueling_mlp needs a discrete action space"),
        (lambda t: t.update(algo={"kind": "r2d2", "sequence_length": 10, "burn_in": 10}),
         "t.yaml: field 'algo.burn_in': 10: must be >= 0 and < sequence_length (10)"),
        (lambda t: t["model"].update(kind="lstm_q"),
         "t.yaml: field 'model.kind': model 'lstm_q' cannot serve algo 'vtrace' "
         "(it serves: r2d2)"),
        (lambda t: t["nodes"]["learner"].update(replicas=2),
         "t.yaml: node 'learner', field 'replicas': data-parallel learner replicas need "
         "algo ppo, not 'vtrace'"),
    ],
)
def test_each_error_names_file_node_and_field(mutate, expected):
    errors = errors_of(mutate)
    assert any(e.startswith(expected) for e in errors), errors


def test_all_errors_reported_in_one_pass():
    def many(t):
        t["nodes"]["learner"]["kind"] = "lerner"
        t["nodes"]["actor"]["replicas"] = 0
        t["nodes"]["broker"]["args"] = {"max_batch": "big"}
        t["algo"]["lr"] = "fast"

    errors = errors_of(many)
    assert len(errors) == 4, errors


def test_impl_must_be_loadable():
    def bad_impl(t):
        t["nodes"]["actor"].pop("kind")
        t["nodes"]["actor"]["impl"] = "no_such_module:Actor"

    errors = errors_of(bad_impl)
    assert any("node 'actor', field 'impl': cannot load no_such_module:Actor" in e for e in errors)


def test_impl_swaps_in_a_class():
    raw = copy.deepcopy(GOOD)
    raw["nodes"]["learner"] = {"impl": "nodes.sink:Sink"}
    topo = from_dict(raw)
    assert topo.nodes["learner"].target == "nodes.sink:Sink"


def test_command_nodes_declare_their_ports():
    raw = copy.deepcopy(GOOD)
    raw["nodes"]["broker"] = {"command": ["./my_broker"], "binds": {"policy": "router"}}
    from_dict(raw)  # the actor's link to broker.policy resolves against the declared port
    raw["nodes"]["broker"]["binds"] = {}
    with pytest.raises(TopologyError, match="binds no port 'policy'"):
        from_dict(raw)


def test_addresses_are_derived(tmp_path):
    raw = copy.deepcopy(GOOD)
    topo = from_dict(raw)
    ends = Endpoints(topo, tmp_path)
    assert ends.bind_address("broker", "policy", 0).startswith("ipc://")
    raw["network"] = {"base_port": 41000}
    raw["nodes"]["learner"]["host"] = "127.0.0.1"
    ends = Endpoints(from_dict(raw), tmp_path)
    tcp = {ends.bind_address("learner", p, 0) for p in ("experience", "params")}
    assert tcp == {"tcp://127.0.0.1:41000", "tcp://127.0.0.1:41001"}
    assert ends.link_addresses("learner.params") == [ends.bind_address("learner", "params", 0)]


def test_ipc_dir_stays_short_for_deep_run_dirs(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    address = Endpoints(from_dict(copy.deepcopy(GOOD)), deep).bind_address("broker", "policy", 0)
    assert len(address) - len("ipc://") < 108


def test_validate_cli_exit_codes(tmp_path):
    bad = copy.deepcopy(GOOD)
    bad["nodes"]["learner"]["kind"] = "lerner"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    runner = CliRunner()
    result = runner.invoke(main, ["validate", str(path)])
    assert result.exit_code == 1
    assert f"error: {path}: node 'learner', field 'kind': unknown kind 'lerner'" in result.output
    ok = runner.invoke(main, ["validate", str(REPO / "topologies" / "seed.yaml")])
    assert ok.exit_code == 0, ok.output
    missing = runner.invoke(main, ["validate", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 1 and "no such file" in missing.output
    garbage = tmp_path / "garbage.yaml"
    garbage.write_text("name: [unclosed")
    assert "not valid YAML" in runner.invoke(main, ["validate", str(garbage)]).output


def test_set_overrides_accept_exponent_floats_and_hint_in_files(tmp_path):
    """YAML 1.1 reads 1e-3 as text: on the command line we mean a number; in a file we
    say how to write it."""
    runner = CliRunner()
    seed = str(REPO / "topologies" / "seed.yaml")
    ok = runner.invoke(main, ["procfile", seed, "--set", "algo.lr=1e-3"])
    assert ok.exit_code == 0, ok.output
    raw = copy.deepcopy(GOOD)
    raw["algo"]["lr"] = "1e-3"
    with pytest.raises(TopologyError, match="write it with a dot"):
        from_dict(raw)


# ----- the typed algorithm config: parsed once, defaults in one place -------------------
TOPOLOGIES = sorted((REPO / "topologies").glob("*.yaml"))


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_every_topology_parses_its_algo_once_with_defaults_from_the_config(path):
    """Leaving out every defaulted ``algo`` field gives the config's defaults, and every
    node reads that same object: an a2c topology without ``unroll`` is a 5-step one for
    the broker, the actors and the learner alike (it used to be 20 for some, 5 for others)."""
    import re

    from zmqrl.parts.algo_config import Parts, config_type
    from zmqrl.run.topology import TopologyError

    raw = yaml.safe_load(path.read_text())
    written = dict(raw.get("algo", {}))
    kind = written.get("kind", "vtrace")
    raw["algo"] = {"kind": kind}  # every other field left to its default ...
    # the file's directory on the import path, as `load` puts it (its parts may live there)
    raw["import_paths"] = [str(path.parent)]
    try:
        topo = from_dict(raw, str(path))
    except TopologyError as exc:
        # ... but for a field the topology's nodes need set (a reanalyse node needs
        # reanalyse: true): kept as written, and only those
        needed = set(re.findall(r"field 'algo\.(\w+)'", str(exc)))
        assert needed and needed <= set(written), exc
        raw["algo"].update({k: written[k] for k in needed})
        topo = from_dict(raw, str(path))
    kept = {k: v for k, v in raw["algo"].items() if k != "kind"}
    cfg = topo.algo_config
    assert type(cfg) is config_type(kind) and cfg == config_type(kind)(**kept)
    assert topo.algo_config is cfg  # parsed once, the same object for every reader
    # the parts are the config's own, but where the file's parts: section names others
    assert topo.parts_config == Parts.of(cfg, raw.get("parts"))


def test_a2c_without_unroll_agrees_between_broker_actor_and_learner(tmp_path):
    """The defect: with ``unroll`` left out, the broker cut 20-step unrolls while the
    A2C learner expected 5 and rejected every one. All read ``topo.algo_config`` now."""
    from nodes.inference_broker import InferenceBroker
    from nodes.learner import Learner
    from zmqrl.bus.node import NodeContext

    raw = yaml.safe_load((REPO / "topologies" / "a2c.yaml").read_text())
    raw["algo"].pop("unroll", None)
    topo = from_dict(raw, "a2c.yaml")
    lengths = {}
    for name, cls in (("broker", InferenceBroker), ("learner", Learner)):
        spec = topo.nodes[name]
        node = cls(NodeContext(topo, spec, 0, tmp_path, Endpoints(topo, tmp_path)))
        node._open_sockets()
        try:
            node.setup()
            lengths[name] = node.unroll if name == "broker" else node.cfg.unroll
        finally:
            for sock in node.sockets.values():
                sock.close(linger=0)
    assert lengths == {"broker": 5, "learner": 5}


def test_impl_module_beside_the_topology_file_loads_without_pythonpath(tmp_path):
    """``impl: myactor:MyActor`` with myactor.py next to the YAML: ``zmqrl validate``
    finds it from any working directory, and the resolved topology a run directory holds
    still finds it (its import_paths are absolute)."""
    import os
    import subprocess
    import sys

    project = tmp_path / "project"
    project.mkdir()
    (project / "myactor.py").write_text(
        "from nodes.actor import Actor\n\n\nclass MyActor(Actor):\n    pass\n")
    raw = copy.deepcopy(GOOD)
    raw["nodes"]["actor"].pop("kind")
    raw["nodes"]["actor"]["impl"] = "myactor:MyActor"
    (project / "t.yaml").write_text(yaml.safe_dump(raw))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "zmqrl.cli", "validate", str(project / "t.yaml")],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok:" in done.stdout
    resolved = yaml.safe_load(yaml.safe_dump(load(project / "t.yaml").to_dict()))
    assert str(project) in resolved["import_paths"]
    (elsewhere / "topology.yaml").write_text(yaml.safe_dump(resolved))
    done = subprocess.run([sys.executable, "-m", "zmqrl.cli", "validate", "topology.yaml"],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
