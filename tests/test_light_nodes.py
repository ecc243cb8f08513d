"""Nodes that run no model never import torch (issue 13, point 4): a remote actor (SEED,
A2C), the replay and the sink start in a fraction of a second and stay small.

Each node runs as a real process. What it imported is read from CPython's own
``-X importtime`` report (``PYTHONPROFILEIMPORTTIME=1``), which names every module the
process imports, at start-up or later, on its stderr; so "torch was never imported" is a
fact about the process, with no hook in the code. Its memory is checked in
``/proc/<pid>/maps`` (no torch library mapped) and ``VmHWM`` (peak RSS); its start-up is
the time from ``Popen`` to the first message it sends. Import and memory facts are
asserted hard; times loosely (CI shares two cores with other tests), with the CPU time
the process used, which the load on the machine inflates far less than its wall time.
"""

from __future__ import annotations

import copy
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
import zmq

from zmqrl.bus import sockets, wire
from zmqrl.bus.endpoints import Endpoints
from zmqrl.run.topology import TopologyError, from_dict, load

from conftest import REPO, pid_of, read_csv, stop_process, wait_for, write_topology

MAX_RSS_MIB = 100  # the bound (torch alone adds ~185 MiB)
# CPU time to the first message sent: 0.4-0.7 s measured on a loaded 2-core machine,
# 1.8-2.4 s when torch was imported (which the import checks catch by themselves).
MAX_CPU_S = 1.5
MAX_WALL_S = 30.0  # only catches a hang: wall time on a loaded CI machine says little


# "import time:  <self us> | <cumulative us> | <indent><module>", maybe after a timestamp
_IMPORT_LINE = re.compile(r"import time:\s+\d+ \|\s+\d+ \|\s*(\S+)\s*$")


def imported_modules(log: Path) -> set[str]:
    """The modules the process imported, from its ``-X importtime`` lines. (CPython
    reports the imports of ``import`` statements, not ``importlib.import_module`` calls
    themselves; torch's own ``import`` statements of its submodules would show.)"""
    return {m.group(1) for m in map(_IMPORT_LINE.search, log.read_text().splitlines()) if m}


def torch_modules(names: set[str]) -> set[str]:
    return {n for n in names if n == "torch" or n.startswith("torch.")}


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def torch_mappings(pid: int) -> list[str]:
    return [line for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if "/torch/" in line]


def check_light(pid: int) -> float:
    """While the node runs: no torch library mapped; returns its peak RSS in MiB."""
    assert torch_mappings(pid) == [], f"torch is mapped into pid {pid}"
    return peak_rss_mib(pid)


def zmqrl(processes, *args: str, log: Path):
    """``python -m zmqrl.cli ARGS`` with its imports reported on its stderr (``log``)."""
    return processes.start([sys.executable, "-m", "zmqrl.cli", *args], log=log,
                           env={"PYTHONPROFILEIMPORTTIME": "1"})


def check_imports(log: Path, own_module: str) -> None:
    """After the node stopped (its report is complete): no torch module, ever."""
    names = imported_modules(log)
    assert own_module in names, f"no importtime report in the log:\n{log.read_text()[-2000:]}"
    assert torch_modules(names) == set()


class FakeBroker:
    """A ROUTER where the inference broker would bind: acts 0 for every env."""

    def __init__(self, address: str):
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(address)
        self.steps = 0
        self.connections: set[bytes] = set()
        self.rewards = 0.0
        self.episodes = 0

    def serve(self, timeout: float) -> wire.Message | None:
        """Answer one message (a step with actions, a ping with a pong)."""
        if not self.sock.poll(int(timeout * 1000)):
            return None
        envelope, body = sockets.split_envelope(self.sock.recv_multipart())
        msg = wire.decode(body)
        if msg.type == wire.PING:
            sockets.send(self.sock, wire.encode(wire.PONG, node="test"), envelope)
        elif msg.type == wire.STEP:
            self.steps += 1
            self.connections.add(envelope[0])
            self.rewards += float(msg["reward"].sum())
            self.episodes += len(msg.arrays.get("ep_return", ()))
            actions = np.zeros(len(msg["obs"]), np.int64)
            sockets.send(self.sock, wire.encode(wire.ACT, {"action": actions},
                                                seq=msg.fields["seq"]), envelope)
        return msg

    def close(self) -> None:
        self.sock.close()


def test_remote_actor_steps_its_envs_without_torch(processes, tmp_path):
    topo = write_topology(tmp_path, nodes={"actor": {"replicas": 1,
                                                     "args": {"envs": 16, "lanes": 2}}})
    run_dir = tmp_path / "run"
    address = Endpoints(load(topo, node="actor"), run_dir).bind_address("broker", "policy", 0)
    broker = FakeBroker(address)
    log = tmp_path / "actor.log"
    try:
        started = time.monotonic()
        proc = zmqrl(processes, "node", str(topo), "actor", "--run-dir", str(run_dir),
                     log=log)
        while (msg := broker.serve(MAX_WALL_S)) is not None and msg.type != wire.STEP:
            pass
        assert msg is not None, f"no step within {MAX_WALL_S}s:\n{log.read_text()[-2000:]}"
        wall, cpu = time.monotonic() - started, cpu_seconds(proc.pid)
        # it really acts: both lanes step their envs, episodes end and are reported
        deadline = time.monotonic() + MAX_WALL_S
        while (broker.steps < 200 or broker.episodes == 0) and time.monotonic() < deadline:
            broker.serve(1.0)
        assert broker.steps >= 200 and len(broker.connections) == 2
        assert broker.rewards > 0 and broker.episodes > 0
        rss = check_light(proc.pid)
        stop_process(proc)
    finally:
        broker.close()
    print(f"\nremote actor: first step after {wall:.2f} s wall, {cpu:.2f} s CPU; "
          f"peak RSS {rss:.0f} MiB")
    check_imports(log, "zmqrl.parts.acting.remote")
    assert rss <= MAX_RSS_MIB
    assert cpu <= MAX_CPU_S


@pytest.mark.parametrize("base, node, port, overrides, module", [
    ("apex.yaml", "replay", "sample", {}, "zmqrl.parts.replay.table"),
    ("seed.yaml", "learner", "experience", {"nodes": {"learner": {"kind": "sink"}}},
     "zmqrl.bus.node"),
], ids=["replay", "sink"])
def test_node_without_a_model_starts_without_torch(processes, client_factory, tmp_path,
                                                   base, node, port, overrides, module):
    topo = write_topology(tmp_path, base, **overrides)
    run_dir = tmp_path / "run"
    address = Endpoints(load(topo, node=node), run_dir).bind_address(node, port, 0)
    log = tmp_path / f"{node}.log"
    started = time.monotonic()
    proc = zmqrl(processes, "node", str(topo), node, "--run-dir", str(run_dir), log=log)
    client = client_factory(address)
    # its first message: the answer to a describe sent before it was up
    reply = client.request(wire.encode(wire.DESCRIBE), timeout=MAX_WALL_S)
    wall, cpu = time.monotonic() - started, cpu_seconds(proc.pid)
    assert reply.type == wire.DESCRIPTION and reply.fields["port"] == port
    assert client.request(wire.encode(wire.PING, seq=1)).type == wire.PONG
    rss = check_light(proc.pid)
    stop_process(proc)
    print(f"\n{node}: first reply after {wall:.2f} s wall, {cpu:.2f} s CPU; "
          f"peak RSS {rss:.0f} MiB")
    check_imports(log, module)
    assert rss <= MAX_RSS_MIB
    assert cpu <= MAX_CPU_S


def test_remote_actors_of_a_seed_run_hold_no_torch(processes, tmp_path):
    """Under ``zmqrl up`` (reporting to the supervisor, writing metrics): the actor
    carries no torch, while the broker, which runs the model, does. (A sink stands in
    for the learner, as in ``zmqrl bench``: one torch process less to wait for.)"""
    topo = write_topology(tmp_path, nodes={"learner": {"kind": "sink"},
                                           "actor": {"replicas": 1, "args": {"envs": 8}}})
    run_dir = tmp_path / "run"
    log = tmp_path / "up.log"
    proc = zmqrl(processes, "up", str(topo), "--run-dir", str(run_dir), log=log)

    def stepped() -> bool:
        rows = read_csv(run_dir / "metrics" / "actor.csv")
        return bool(rows) and int(rows[-1]["env_steps"]) > 0

    wait_for(stepped, 120, "the actor to step its envs (through the broker)")
    # the checks can see torch: the broker has it
    assert torch_mappings(pid_of(run_dir, "broker"))
    rss = check_light(pid_of(run_dir, "actor"))
    stop_process(proc)
    print(f"\nremote actor under zmqrl up: peak RSS {rss:.0f} MiB")
    check_imports(run_dir / "logs" / "actor.log", "zmqrl.parts.acting.remote")
    assert torch_modules(imported_modules(run_dir / "logs" / "broker.log"))
    assert rss <= MAX_RSS_MIB



def test_a_node_process_checks_its_own_spec_and_leaves_the_rest_to_up():
    """``zmqrl node`` loads with ``node=NAME``: its own spec is checked, the other nodes'
    and the model (whose check builds it, with torch) are ``up``'s and ``validate``'s."""
    raw = yaml.safe_load((REPO / "topologies" / "seed.yaml").read_text())
    raw["model"] = {"kind": "mlp", "hidden": "wide"}
    raw["nodes"]["broker"]["args"] = {"mode": "bogus"}
    with pytest.raises(TopologyError) as everything:
        from_dict(copy.deepcopy(raw), "t.yaml")
    assert [e.split(":")[1].strip() for e in everything.value.errors] == [
        "node 'broker', field 'args.mode'", "field 'model'"]
    assert from_dict(copy.deepcopy(raw), "t.yaml", node="actor").nodes["actor"]
    with pytest.raises(TopologyError) as own:
        from_dict(copy.deepcopy(raw), "t.yaml", node="broker")
    assert len(own.value.errors) == 1 and "args.mode" in own.value.errors[0]
