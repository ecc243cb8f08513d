"""Parts from outside the package plug in by name, exactly as the built-ins do, and the
run counts a node by the role it says, not by its kind.

* The example plug-in (examples/plugins/boltzmann: its own algorithm config, learner,
  behaviour and model, registered by entry points) is pip-installed into a directory
  outside the package and trains under ``zmqrl up`` to the target its topology declares.
* A second plug-in, written here into a temporary directory — a subclass of the built-in
  actor (``impl:``) and a new behaviour (``parts.behaviour: module:Class``) — counts its
  steps in the progress line and ``run.csv`` and stops the run at ``--max-steps``.
* Unknown names are errors naming the part, and nothing is a closed table: the built-ins
  are what zmqrl's own entry points register.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from zmqrl import plugins
from zmqrl.cli import main
from zmqrl.run.topology import TopologyError, load

from conftest import REPO, read_csv, write_topology
from expect import expectation

pytestmark = pytest.mark.minutes(1)  # tests/conftest.py: long modules first

PLUGIN = REPO / "examples" / "plugins" / "boltzmann"


def test_builtin_parts_are_registered_through_the_entry_points_a_plugin_uses():
    """No table of zmqrl's decides what exists: its parts are the entry points of its
    own distribution, in the same groups a plug-in writes to."""
    from importlib import metadata

    for part, group in plugins.GROUPS.items():
        ours = [ep for ep in metadata.entry_points(group=group)
                if getattr(ep.dist, "name", None) == "zmqrl"]
        assert ours, f"zmqrl registers no {part}"
        assert {ep.name for ep in ours} <= set(plugins.names(part))
    assert plugins.import_path("node", "actor") == "nodes.actor:Actor"
    assert plugins.resolve("algo", "dqn").__name__ == "DQNConfig"


@pytest.mark.parametrize("field, value, message", [
    (("algo", "kind"), "sarsa", "field 'algo.kind': unknown algorithm 'sarsa' (known: "),
    (("model", "kind"), "no_such_net", "field 'model': model.kind: unknown model 'no_such_net'"),
    (("parts", "behaviour"), "wobble", "field 'parts.behaviour': unknown behaviour 'wobble'"),
    (("parts", "behaviour"), "zmqrl.parts.acting.envs:EpisodeTracker",
     "field 'parts.behaviour': behaviour 'zmqrl.parts.acting.envs:EpisodeTracker' is not a "
     "zmqrl.parts.acting.Behaviour subclass"),
    (("parts", "source"), "nowhere:Source", "field 'parts.source': source 'nowhere:Source' "
                                            "cannot be loaded"),
    (("parts", "items"), "marbles", "field 'parts.items': 'marbles' is no item kind"),
])
def test_a_part_that_resolves_to_nothing_is_an_error_naming_it(tmp_path, field, value,
                                                                message):
    section, key = field
    path = write_topology(tmp_path, "apex.yaml", **{section: {key: value}})
    with pytest.raises(TopologyError) as err:
        load(path)
    assert any(message in e for e in err.value.errors), err.value.errors


def test_a_behaviour_lacking_a_method_is_a_validate_error_naming_it(tmp_path):
    (tmp_path / "half_done.py").write_text(textwrap.dedent("""
        from zmqrl.parts.acting.behaviour import Behaviour

        class HalfDone(Behaviour):
            def inputs(self):
                return {"obs": self.obs}
    """))
    path = write_topology(tmp_path, "seed.yaml", parts={"behaviour": "half_done:HalfDone"})
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code != 0
    for method in ("forward", "record", "_outcome"):
        assert f"behaviour 'half_done:HalfDone' does not define '{method}'" in result.output


def _install_example(target: Path) -> dict[str, str]:
    """pip-install the example plug-in into ``target`` (outside the package and the
    venv's site-packages); the environment that makes a process see it."""
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(PLUGIN)],
                   check=True, capture_output=True, timeout=300)
    return {"PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}


def test_the_example_plugin_installs_from_outside_and_learns(processes, tmp_path):
    env = _install_example(tmp_path / "site")
    topology = PLUGIN / "boltzmann.yaml"
    expect = expectation(topology)
    assert expect.target is not None  # the example must learn, not only run
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    proc = processes.start(
        [sys.executable, "-m", "zmqrl.cli", "up", str(topology), "--run-dir", str(run_dir),
         "--max-seconds", str(expect.seconds), "--target-return", str(expect.target)],
        log=log, env=env)
    assert proc.wait(timeout=expect.seconds + 90) == 0, log.read_text()[-3000:]
    out = log.read_text()
    assert re.search(rf"target return {expect.target:g} reached", out), out[-3000:]
    rows = read_csv(run_dir / "metrics" / "learner.csv")
    assert max(int(r["updates"]) for r in rows) >= expect.min_updates


MY_PARTS = '''
"""A user's parts, beside their topology: an actor subclass and a behaviour."""
import os
from pathlib import Path

from nodes.actor import Actor
from zmqrl.parts.actor_critic.acting import ActorCriticBehaviour


class CountingActor(Actor):
    """The built-in actor under another name: the run must count it all the same."""


class MarkedBehaviour(ActorCriticBehaviour):
    """Acts as the built-in does, and leaves a mark that it was the one acting."""

    def record(self, outputs, version):
        Path(os.environ["MARK_DIR"], f"acted-{os.getpid()}").touch()
        return super().record(outputs, version)
'''


def test_an_impl_actor_with_its_own_behaviour_counts_and_stops_at_max_steps(processes,
                                                                            tmp_path):
    (tmp_path / "my_parts.py").write_text(MY_PARTS)
    marks = tmp_path / "marks"
    marks.mkdir()
    raw = yaml.safe_load((REPO / "topologies" / "impala.yaml").read_text())
    raw["parts"] = {"behaviour": "my_parts:MarkedBehaviour"}
    for spec in raw["nodes"].values():
        if spec.get("kind") == "actor":
            spec.pop("kind")
            spec["impl"] = "my_parts:CountingActor"
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(raw))
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    proc = processes.start([sys.executable, "-m", "zmqrl.cli", "up", str(path), "--run-dir",
                            str(run_dir), "--max-steps", "5000", "--max-seconds", "150"],
                           log=log, env={"MARK_DIR": str(marks)})
    assert proc.wait(timeout=240) == 0, log.read_text()[-3000:]
    out = log.read_text()
    assert "--max-steps 5000 reached" in out, out[-3000:]
    steps = int(read_csv(run_dir / "metrics" / "run.csv")[-1]["env_steps"])
    assert steps >= 5000
    assert list(marks.glob("acted-*")), "the topology's behaviour did not act"


# A node in any language: here a Python script that speaks only the supervisor messages
# (docs/protocol.md §9), saying its role (or not) and reporting made-up env steps.
COMMAND_NODE = '''
import os, sys, time
import msgpack, zmq

address, role = sys.argv[1], sys.argv[2]
sock = zmq.Context().socket(zmq.DEALER)
sock.connect(address)
label = os.environ["ZMQRL_NODE"]

def send(t, **fields):
    sock.send(msgpack.packb({"v": 1, "t": t, "label": label, **fields, "arrays": []}))

hello = {"kind": "counting_script", "node": label.split(".")[0], "replica": 0,
         "incarnation": "x" * 12, "pid": os.getpid(),
         "secret": os.environ["ZMQRL_NODE_SECRET"]}  # what makes its reports believed
if role != "none":
    hello["role"] = role
send("hello", **hello)
steps = 0
while True:
    steps += 1000
    send("heartbeat")
    send("metrics", row={"time_s": 0.0, "env_steps": steps}, episodes=[])
    time.sleep(0.1)
'''


@pytest.mark.parametrize("role", ["acts", "none"])
def test_a_command_node_counts_by_the_role_it_says(processes, tmp_path, role):
    """A command node that says it acts counts its env steps toward --max-steps exactly
    as a built-in actor would; one that says no role is not counted."""
    from zmqrl.bus.endpoints import supervisor_address

    script = tmp_path / "counting.py"
    script.write_text(COMMAND_NODE)
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    raw = {"name": "command-only", "env": {"id": "CartPole-v1"}, "nodes": {"counter": {
        "command": [sys.executable, str(script), supervisor_address(run_dir), role]}}}
    path = tmp_path / "command.yaml"
    path.write_text(yaml.safe_dump(raw))
    proc = processes.zmqrl("up", str(path), "--run-dir", str(run_dir), "--max-steps", "20000",
                           "--max-seconds", "20" if role == "acts" else "6", log=log)
    assert proc.wait(timeout=80) == 0, log.read_text()[-3000:]
    out = log.read_text()
    steps = int(read_csv(run_dir / "metrics" / "run.csv")[-1]["env_steps"])
    if role == "acts":
        assert "--max-steps 20000 reached" in out, out[-3000:]
        assert steps >= 20000
    else:
        assert "--max-seconds 6 reached" in out, out[-3000:]
        assert steps == 0


def test_behaviour_args_take_numbers_and_per_replica_schedules():
    from zmqrl.parts.acting.envs import apex_epsilon, behaviour_args

    given = {"noise": 0.3, "temperature": {"linear": [0.2, 0.02]},
             "epsilon": {"apex": {"base": 0.4, "alpha": 7}}, "scale": {"per_replica": [1, 2, 3]}}
    first, last = behaviour_args(given, 0, 3), behaviour_args(given, 2, 3)
    assert first == {"noise": 0.3, "temperature": 0.2, "epsilon": 0.4, "scale": 1.0}
    assert last["temperature"] == pytest.approx(0.02) and last["scale"] == 3.0
    assert last["epsilon"] == pytest.approx(apex_epsilon(2, 3))
    for bad in ({"x": "hot"}, {"x": float("nan")}, {"x": {"per_replica": [1, 2]}},
                {"x": {"wobble": 1}}):
        with pytest.raises(ValueError, match="behaviour_args.x"):
            behaviour_args(bad, 0, 3)


def test_a_bad_behaviour_schedule_is_a_validate_error(tmp_path):
    path = write_topology(tmp_path, "apex.yaml", nodes={"actor": {"args": {
        "behaviour_args": {"noise": {"per_replica": [0.1]}}}}})
    with pytest.raises(TopologyError) as err:
        load(path)
    assert any("field 'args.behaviour_args': behaviour_args.noise" in e
               for e in err.value.errors), err.value.errors


def test_a_node_class_with_an_unknown_role_is_a_validate_error(tmp_path):
    (tmp_path / "odd_node.py").write_text(textwrap.dedent("""
        from nodes.sink import Sink

        class OddSink(Sink):
            role = "dances"
    """))
    path = write_topology(tmp_path, "seed.yaml",
                          nodes={"learner": {"kind": None, "impl": "odd_node:OddSink"}})
    raw = yaml.safe_load(path.read_text())
    raw["nodes"]["learner"].pop("kind")
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(TopologyError) as err:
        load(path)
    assert any("odd_node:OddSink.role is 'dances', not one of" in e
               for e in err.value.errors), err.value.errors
