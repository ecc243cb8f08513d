"""``zmqrl up --engine ray`` on a real Ray cluster of two Ray nodes on this machine.

The module starts one cluster for all its tests (Ray takes tens of seconds to start):
``ray start --head`` with a ``head`` resource and a second ``ray start --address …``
with an ``actors`` resource, each with its own temporary directory and its own free
ports, stopped in teardown through their own ``ray start --block`` processes (never a
global ``ray stop``, which would end other users' clusters). Topologies pin the learner
side to the head and the actors to the other node.

Addresses stay on loopback: the head is 127.0.0.2 and the second node 127.0.0.3 (Ray
turns ``--node-ip-address 127.0.0.1`` into the machine's routable address, which a test
machine may not allow; any other 127.x address is taken as given), and nodes bind where
Ray says their node is. The tests that need no cluster (placement bundles, endpoint
tables, per-address CURVE server keys) run without Ray installed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
import zmq

from zmqrl.bus import security, sockets
from zmqrl.bus.endpoints import Endpoints
from zmqrl.run.engines import keys, placement
from zmqrl.run.topology import TopologyError, from_dict

from conftest import (
    REPO,
    free_base_port,
    machine,
    pid_of,
    read_csv,
    stop_all,
    wait_for,
    write_topology,
)

pytestmark = pytest.mark.minutes(2)  # tests/conftest.py: long modules first

HEAD_IP, OTHER_IP = "127.0.0.2", "127.0.0.3"
RAY_START_S = 180  # a loaded 2-core machine takes 20-40 s per Ray node
WORKER_PORTS = 30  # Ray worker processes per Ray node, at most
# For the cluster's processes and the drivers alike. Ray >= 2.5x turns token auth on for a
# head when ~/.ray/auth_token exists (a local Ray made it) but not for a node joining it:
# say what this loopback-only cluster uses, whatever the home directory holds.
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


# ----- without a cluster --------------------------------------------------------------
def test_resources_become_one_bundle_per_replica():
    from zmqrl.run.topology import merge

    raw = merge(yaml.safe_load((REPO / "topologies" / "seed.yaml").read_text()), {"nodes": {
        "learner": {"resources": {"cpus": 2, "gpus": 1}, "host": "10.0.0.5"},
        "actor": {"resources": {"cpus": 0.5, "custom": {"actors": 1, "unused": 0}}}}})
    topo = from_dict(raw)
    slots = placement.slots(topo)
    assert [s.label for s in slots] == ["learner", "broker", "actor.0", "actor.1"]
    assert slots[0].bundle == {"CPU": 2.0, "GPU": 1.0, "node:10.0.0.5": 0.001}
    assert slots[1].bundle == {"CPU": placement.DEFAULT_CPUS}
    assert slots[2].bundle == {"CPU": 0.5, "actors": 1.0}
    assert slots[3].actor_options() == {"num_cpus": 0.5, "num_gpus": 0.0,
                                        "resources": {"actors": 1.0}}
    assert placement.totals([s.bundle for s in slots])["CPU"] == 4.0
    assert placement.bundle({}) == {"CPU": placement.DEFAULT_CPUS}
    assert placement.bundle({"cpus": 0}) == {"CPU": 0.001}  # Ray refuses empty bundles


def test_bad_resources_are_reported_with_node_and_field(tmp_path):
    raw = yaml.safe_load((REPO / "topologies" / "seed.yaml").read_text())
    raw["nodes"]["learner"]["resources"] = {"cpus": -1, "tpus": 4}
    raw["nodes"]["actor"]["resources"] = {"custom": {"actors": "many"}}
    with pytest.raises(TopologyError) as info:
        from_dict(raw, "t.yaml")
    text = "\n".join(info.value.errors)
    assert "node 'learner', field 'resources'" in text and "tpus" in text
    assert "node 'learner', field 'resources.cpus'" in text
    assert "node 'actor', field 'resources.custom.actors'" in text


def test_an_endpoints_table_round_trips(tmp_path):
    table = {"broker.policy": ["tcp://127.0.0.3:4000"],
             "actor.x": ["tcp://127.0.0.2:1", "tcp://127.0.0.3:2"]}
    Endpoints.from_table(table).save(tmp_path / "e.json")
    loaded = Endpoints.load(tmp_path / "e.json")
    assert loaded.bind_address("actor", "x", 1) == "tcp://127.0.0.3:2"
    assert loaded.link_addresses("broker.policy") == ["tcp://127.0.0.3:4000"]
    with pytest.raises(ValueError, match="bad endpoints entry"):
        Endpoints.from_table({"nodot": ["tcp://x:1"]})


def test_one_socket_reaches_servers_with_keys_of_their_own(tmp_path):
    """What a node under Ray does: each replica it links to has its own server key
    (``servers.json``), and one DEALER connects to all of them under CURVE; a server
    lets in only the run's client key."""
    ctx = zmq.Context.instance()
    client = zmq.curve_keypair()
    servers, dirs = [], []
    for i in range(2):
        d = tmp_path / f"server{i}"
        keys.server_keypair(d)
        keys.write_node_keys(d, client, {})
        sock = sockets.bind(ctx, "router", "tcp://127.0.0.1:*",
                            sockets.SocketOptions(curve=security.load_keys(d)))
        servers.append((sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)))
        dirs.append(d)
    # One ZAP handler per process (as in a node): both servers let in the run's client.
    auth = security.Authenticator(ctx, security.load_keys(dirs[0]), logging.getLogger("t"))
    auth.start()
    assert keys.server_keypair(dirs[0]) == security.load_keys(dirs[0]).server_public  # kept
    me = tmp_path / "client"
    keys.server_keypair(me)
    keys.write_node_keys(me, client, {addr: security.load_keys(d).server_public
                                      for (_, addr), d in zip(servers, dirs, strict=True)})
    assert security.check_key_dir(me) == []
    mine = security.load_keys(me)
    dealer = sockets.connect(ctx, "dealer", [addr for _, addr in servers],
                             sockets.SocketOptions(curve=mine))
    stranger = sockets.connect(ctx, "dealer", [servers[0][1]], sockets.SocketOptions(
        curve=security.CurveKeys(me, mine.server_public, b"", *zmq.curve_keypair(),
                                 frozenset(), mine.server_keys)))
    try:
        dealer.send(b"hello 0")  # round-robin: one to each server
        dealer.send(b"hello 1")
        # Not a blocking send: once the server refuses the stranger's key, libzmq may
        # tear its pipe down before the send, and a DEALER with no pipe blocks forever
        # (the CI run that hung here for 10 minutes). Queued or not, it must not arrive.
        with contextlib.suppress(zmq.Again):
            stranger.send(b"intruder", zmq.NOBLOCK)
        got = sorted(s.recv_multipart()[-1] for s, _ in servers if s.poll(5000))
        assert got == [b"hello 0", b"hello 1"]  # both handshakes, each with its own key
        wait_for(lambda: auth.denied > 0, 5, "the stranger's key to be refused")
        assert not servers[0][0].poll(300)  # and its message never arrives
    finally:
        for sock in (dealer, stranger):
            sock.close(linger=0)
        for sock, _ in servers:
            sock.close(linger=0)
        auth.stop()


def test_procfile_for_one_host_holds_only_its_nodes(tmp_path):
    from zmqrl.run.launch import procfile
    from zmqrl.run.topology import load

    topo = load(write_topology(tmp_path, nodes={"learner": {"host": "10.0.0.1"},
                                                 "broker": {"host": "10.0.0.1"},
                                                 "actor": {"host": "10.0.0.2"}}))
    lines = procfile(topo, "t.yaml", "runs/x", host="10.0.0.2").splitlines()
    assert lines[0].endswith("--host 10.0.0.2")
    assert [ln.split(":")[0] for ln in lines[1:]] == ["actor_0", "actor_1"]
    assert len(procfile(topo, "t.yaml", "runs/x").splitlines()) == 5


# ----- the cluster ----------------------------------------------------------------------
@dataclass
class RayCluster:
    address: str
    procs: list[subprocess.Popen]
    temp_dirs: list[Path]


def _ray_node(cmd: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, **RAY_ENV, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def _start_ray_node(cmd: list[str], log: Path, procs: list[subprocess.Popen]) -> None:
    """``ray start --block``, tried again if it gives up: Ray waits a fixed 30 s for its
    raylet to register, which a heavily loaded machine can miss."""
    for attempt in range(3):
        proc = _ray_node(cmd, log)
        procs.append(proc)

        def started(proc: subprocess.Popen = proc) -> bool | str:
            if proc.poll() is not None:
                return "exited"
            return "Ray runtime started" in log.read_text()

        if wait_for(started, RAY_START_S, f"ray start ({log.name})", interval=0.5) is True:
            return
        stop_all([proc])  # whatever it left running in its process group
        if attempt == 2:
            raise AssertionError(f"ray start exited with {proc.returncode}:\n"
                                 f"{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory) -> Iterator[RayCluster]:
    pytest.importorskip("ray")
    ray_bin = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    logs = tmp_path_factory.mktemp("ray-logs")
    # Short temp dirs: Ray's Unix sockets live under them (108-byte paths).
    temps = [Path(tempfile.mkdtemp(prefix="zr-", dir="/tmp")) for _ in range(2)]
    per_node = 10 + WORKER_PORTS
    base = free_base_port(2 * per_node, host="0.0.0.0")
    procs: list[subprocess.Popen] = []

    def common(i: int, ip: str, resources: dict[str, float]) -> list[str]:
        p = base + i * per_node
        args = ["--block", "--node-ip-address", ip, "--num-cpus", "4",
                "--resources", json.dumps(resources), "--temp-dir", str(temps[i]),
                "--disable-usage-stats", "--object-store-memory", str(100 * 2**20),
                "--node-manager-port", str(p + 1), "--object-manager-port", str(p + 2),
                "--dashboard-agent-listen-port", str(p + 3),
                "--dashboard-agent-grpc-port", str(p + 4),
                "--runtime-env-agent-port", str(p + 5), "--metrics-export-port", str(p + 6),
                "--min-worker-port", str(p + 10),
                "--max-worker-port", str(p + 10 + WORKER_PORTS - 1)]
        return args

    gcs = base
    head = [ray_bin, "start", "--head", "--port", str(gcs), "--include-dashboard", "false",
            "--dashboard-port", str(base + 7)] + common(0, HEAD_IP, {"head": 4})
    if importlib.util.find_spec("grpc") is not None:  # Ray then starts its client server
        head += ["--ray-client-server-port", str(base + 8)]
    try:
        # The second node only once the head has started: it looks up the head node's
        # record in the GCS, which comes after the GCS port listens.
        with machine(tmp_path_factory):  # no exclusive test beside its start
            _start_ray_node(head, logs / "head.log", procs)
            other = [ray_bin, "start", "--address", f"{HEAD_IP}:{gcs}"] + \
                common(1, OTHER_IP, {"actors": 4})
            _start_ray_node(other, logs / "other.log", procs)
        yield RayCluster(f"{HEAD_IP}:{gcs}", procs, temps)
    finally:
        # `ray start --block` stops its own processes on SIGTERM (both at once), and the
        # rest of its process group is killed after the grace period.
        stop_all(procs)
        for temp in temps:
            for pid in _pids_mentioning(str(temp)):  # a Ray worker that outlived its raylet
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            shutil.rmtree(temp, ignore_errors=True)


def _pids_mentioning(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry.name))
    return found


def _ray_actor_pids(cls: str) -> list[int]:
    """Ray worker processes running one of our actors (their title names the class)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cmdline.startswith(f"ray::{cls}"):
            found.append(int(entry.name))
    return found


# Learner side on the head, actors on the other Ray node. The actors take all of the
# `actors` resource, so a placement group that an earlier test left behind would make
# the next test's placement fail.
ON_HEAD = {"cpus": 1, "custom": {"head": 1}}
ON_OTHER = {"cpus": 1, "custom": {"actors": 2}}


def _topology(tmp_path: Path, **extra) -> Path:
    return write_topology(tmp_path, **{"nodes": {
        "learner": {"resources": ON_HEAD},
        "broker": {"resources": ON_HEAD},
        "actor": {"replicas": 2, "args": {"envs": 16}, "resources": ON_OTHER}}} | extra)


def _up(processes, tmp_path: Path, cluster: RayCluster, *args: str):
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    proc = _driver(processes, log, str(_topology(tmp_path)), "--address", cluster.address,
                   "--run-dir", str(run_dir), *args)
    return proc, run_dir, log


def _driver(processes, log: Path, *args: str) -> subprocess.Popen:
    return processes.start([sys.executable, "-m", "zmqrl.cli", "up", "--engine", "ray",
                            *args], log=log, env=RAY_ENV)


def _placed_on(log: Path) -> dict[str, str]:
    out = {}
    for line in log.read_text().splitlines():
        if line.startswith("zmqrl up: placed "):
            label, _, rest = line.removeprefix("zmqrl up: placed ").partition(" on ")
            out[label] = rest.split()[0]
    return out


def test_a_run_across_two_ray_nodes_learns_recovers_and_stops_cleanly(
        ray_cluster, processes, tmp_path):
    """One run (Ray is slow to start): SEED learns with the learner side on the head and
    the actors on the other Ray node; kill -9 of an actor's node process, of the
    broker's and of a replica's Ray actor each recover, also when the replica is placed
    again at new addresses; Ctrl-C leaves nothing."""
    proc, run_dir, log = _up(processes, tmp_path, ray_cluster, "--max-seconds", "400")

    def values(label: str, column: str) -> list[float]:
        rows = read_csv(run_dir / "metrics" / f"{label}.csv")
        return [float(r[column]) for r in rows if r.get(column)]

    def alive() -> None:
        assert proc.poll() is None, log.read_text()[-4000:]

    def flowing(since: dict[tuple[str, str], tuple[int, float]]) -> bool:
        """Every count grew since ``since`` ((rows, last value) per node and column),
        counting a restarted node's new rows, which start again from 0."""
        alive()
        for (label, column), (n, value) in since.items():
            new = values(label, column)[n:]
            if not (new and new[-1] > value) and not (len(new) >= 2 and new[-1] > new[0]):
                return False
        return True

    def marks() -> dict[tuple[str, str], tuple[int, float]]:
        out = {}
        for key in (("learner", "updates"), ("broker", "env_steps"),
                    ("actor.0", "env_steps"), ("actor.1", "env_steps")):
            seen = values(*key)
            out[key] = (len(seen), seen[-1] if seen else 0.0)
        return out

    def learned() -> bool:
        alive()
        rows = read_csv(run_dir / "metrics" / "run.csv")
        return bool(rows) and float(rows[-1]["return_mean_100"] or "nan") >= 100

    try:
        wait_for(lambda: flowing(dict.fromkeys(marks(), (0, 0.0))), 180,
                 "experience to flow")
        # 1. Placed where the resources say, the actors reach the broker on the head's
        #    address over tcp, expecting the broker's own server key; CURVE is on.
        out = log.read_text()
        assert "CURVE (per-node server keys made on their hosts)" in out
        assert _placed_on(log) == {"learner": HEAD_IP, "broker": HEAD_IP,
                                   "actor.0": OTHER_IP, "actor.1": OTHER_IP}
        table = json.loads((run_dir / "ray" / "actor.0" / "endpoints.json").read_text())
        assert table["broker.policy"][0].startswith(f"tcp://{HEAD_IP}:")
        servers = json.loads((run_dir / "ray" / "actor.0" / "keys" / "servers.json")
                             .read_text())
        broker_key = security.load_keys(run_dir / "ray" / "broker" / "keys").server_public
        assert servers[table["broker.policy"][0]] == broker_key.decode()
        # 2. It learns (a random policy's mean return is about 22).
        wait_for(learned, 180, "a mean return of 100 over 100 episodes")
        # `zmqrl status` sees a Ray run as it sees any: every node alive with its links
        # (the nodes write their status files into the run directory, on every host).
        from zmqrl.bus.status import snapshot

        view = {n.label: n for n in snapshot(run_dir).nodes}
        assert {label: view[label].state for label in view} == dict.fromkeys(
            ("learner", "broker", "actor.0", "actor.1"), "alive"), view
        assert "broker.policy" in {link.peer for link in view["actor.0"].links}
        assert "learner.experience" in {link.peer for link in view["broker"].links}
        # 3. kill -9 of an actor's node process: restarted by its policy, as under `up`.
        os.kill(pid_of(run_dir, "actor", 0), signal.SIGKILL)
        wait_for(lambda: "actor.0 exited with -9; restart 1/" in log.read_text(), 30,
                 "the supervisor to see actor.0's exit")
        before = marks()
        wait_for(lambda: flowing(before)
                 and (run_dir / "logs" / "actor.0.log").read_text().count("up (incarn") == 2,
                 60, "actor.0 back and experience flowing")
        # 4. kill -9 of the broker's node process: the actors' requests find the new one.
        os.kill(pid_of(run_dir, "broker"), signal.SIGKILL)
        wait_for(lambda: "broker exited with -9; restart 1/" in log.read_text(), 30,
                 "the supervisor to see the broker's exit")
        before = marks()
        wait_for(lambda: flowing(before), 90, "experience through the new broker")
        # 5. kill -9 of the Ray actor that runs actor.1: its node dies with it, and a new
        #    Ray actor in the same bundle starts the node again.
        node_pid = pid_of(run_dir, "actor", 1)
        wrapper = int(Path(f"/proc/{node_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert Path(f"/proc/{wrapper}/cmdline").read_bytes().startswith(b"ray::NodeHost")
        os.kill(wrapper, signal.SIGKILL)
        wait_for(lambda: "actor.1's Ray actor on 127.0.0.3 is gone" in log.read_text(), 30,
                 "the supervisor to see the Ray actor go")
        wait_for(lambda: not Path(f"/proc/{node_pid}").exists(), 10,
                 "actor.1's node to die with its Ray actor")
        before = marks()
        wait_for(lambda: flowing(before), 90, "actor.1 back and experience flowing")
        # 6. The broker's Ray actor dies and its port is taken meanwhile (as when its
        #    host is gone and Ray places it elsewhere): placed again at a new address,
        #    the nodes linked to it are restarted (not as failures) and find it there.
        endpoints = run_dir / "ray" / "actor.0" / "endpoints.json"
        old = json.loads(endpoints.read_text())["broker.policy"][0]
        node_pid = pid_of(run_dir, "broker")
        wrapper = int(Path(f"/proc/{node_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(wrapper, signal.SIGKILL)
        holder = socket.socket()
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

        def take_port() -> bool:
            try:
                holder.bind((HEAD_IP, int(old.rsplit(":", 1)[1])))
                holder.listen()
                return True
            except OSError:
                return False

        try:
            wait_for(take_port, 10, "the broker's old port to be free")
            wait_for(lambda: "broker moved; restarting actor.1" in log.read_text(), 60,
                     "the broker to be placed again and the actors restarted")
            before = marks()
            wait_for(lambda: flowing(before), 90, "experience through the moved broker")
        finally:
            holder.close()
        assert json.loads(endpoints.read_text())["broker.policy"][0] != old
        assert log.read_text().count("actor.0 exited") == 1  # the relink is no failure
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{log.read_text()[-5000:]}") from None
    assert log.read_text().count("zmqrl up: placed actor.1 on 127.0.0.3") == 2
    # 7. Ctrl-C on the driver stops every node on both Ray nodes, and our Ray actors.
    assert len(_ray_actor_pids("NodeHost")) == 4
    started = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 0, log.read_text()[-4000:]
    assert time.monotonic() - started < 30
    out = log.read_text()
    assert "stopped (SIGINT received)" in out
    assert not _pids_mentioning(str(run_dir))
    wait_for(lambda: not _ray_actor_pids("NodeHost") and not _ray_actor_pids("Registry"), 30,
             "the run's Ray actors to be gone")
    # Logs and the progress line came back to the driver.
    assert " actor.1 | INFO actor.1: up (incarnation" in out and "return(100)" in out
    assert "INFO learner: stopped" in (run_dir / "logs" / "learner.log").read_text()


def test_a_run_the_cluster_cannot_hold_is_refused_with_what_it_needs(
        ray_cluster, processes, tmp_path):
    topo = _topology(tmp_path, name="too-big")
    raw = yaml.safe_load(topo.read_text())
    raw["nodes"]["actor"]["resources"] = {"cpus": 1, "custom": {"actors": 3}}  # 6 > 4
    topo.write_text(yaml.safe_dump(raw))
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    proc = _driver(processes, log, str(topo), "--address", ray_cluster.address,
                   "--run-dir", str(run_dir), "--placement-timeout", "3")
    assert proc.wait(timeout=90) == 1, log.read_text()[-3000:]
    out = log.read_text()
    assert "cannot place the run (pack) within 3s" in out
    assert "actors: 6" in out and "actor.1: {CPU: 1, actors: 3}" in out
    # All of `actors` is free: the run before this one removed its placement group.
    assert "free {CPU: 8, actors: 4, head: 4}" in out
    assert not _pids_mentioning(str(run_dir))
