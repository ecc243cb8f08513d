"""``zmqrl up --engine ray`` on one machine exposes nothing to the network (issue 29,
defect 4): with no ``--address`` zmqrl starts its Ray on loopback and every node port and
the supervisor socket bind loopback; on a cluster with a routable address CURVE is on,
and plain tcp there only with ``--no-curve``, loudly.

The decisions are plain functions of addresses (:mod:`zmqrl.run.engines.exposure`),
tested without Ray; one run with a local Ray checks every listening socket of the run's
processes (Ray's own included) and a spoofed hello over its tcp supervisor socket.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path

import msgpack
import pytest
import zmq

from zmqrl.bus import wire
from zmqrl.run.engines import exposure

from conftest import pid_of, read_csv, wait_for, write_topology

# No cluster of the environment (a local Ray of our own), no usage reports, and no token
# auth that a ~/.ray/auth_token of another local Ray would turn on.
RAY_ENV = {"RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def _routable_ip() -> str | None:
    """An address of this machine that is not loopback, if it has one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent; the kernel picks a source
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if exposure.is_loopback(ip) else ip


# ----- without Ray ----------------------------------------------------------------------
def test_loopback_addresses_and_this_hosts_own():
    for ip in ("127.0.0.1", "127.0.0.3", "::1", "::ffff:127.0.0.1", "[::1]"):
        assert exposure.is_loopback(ip), ip
    for ip in ("10.1.2.3", "192.0.2.7", "::ffff:10.0.0.1", "0.0.0.0", "::", "a-host"):
        assert not exposure.is_loopback(ip), ip
    assert exposure.on_this_host("127.0.0.2")
    assert not exposure.on_this_host("192.0.2.254")  # TEST-NET-1: never one of ours
    routable = _routable_ip()
    if routable is not None:
        assert exposure.on_this_host(routable)


def test_a_cluster_on_this_machine_binds_loopback_and_needs_no_curve():
    routable = _routable_ip() or "127.0.0.5"
    # zmqrl started the Ray; or every Ray node is an address of this host
    for ips, started in ((["127.0.0.1"], True), ([routable], False), ([routable], True),
                         (["127.0.0.2"], False)):
        decided = exposure.decide(ips, started, None, configured=False)
        assert decided.loopback and not decided.curve and decided.warning is None, ips
        assert exposure.bind_ip(ips[0], decided.loopback) in ("127.0.0.1", "127.0.0.2")
    # Several Ray nodes on loopback addresses (tests/test_ray.py's cluster): CURVE stays on
    # by default, and their own loopback addresses are kept.
    decided = exposure.decide(["127.0.0.2", "127.0.0.3"], False, None, configured=False)
    assert decided.loopback and decided.curve
    assert exposure.bind_ip("127.0.0.3", True) == "127.0.0.3"


def test_a_routable_address_gets_curve_and_plain_tcp_only_when_asked_loudly():
    remote = ["192.0.2.10"]  # not this host
    decided = exposure.decide(remote, False, None, configured=False)
    assert not decided.loopback and decided.curve and not decided.plain_tcp_ok
    assert exposure.bind_ip("192.0.2.10", decided.loopback) == "192.0.2.10"
    # the topology's own keys: CURVE, but not generated keys
    decided = exposure.decide(remote, False, None, configured=True)
    assert not decided.curve and decided.warning is None and not decided.plain_tcp_ok
    decided = exposure.decide(remote, False, False, configured=False)
    assert not decided.curve and decided.plain_tcp_ok
    assert decided.warning and "WARNING" in decided.warning and "192.0.2.10" in decided.warning
    # Where a wrapper binds: plain tcp on a routable address is refused unless allowed.
    with pytest.raises(RuntimeError, match="actor.0: refusing to bind plain tcp on 192.0.2.10"):
        exposure.check_bind("actor.0", "192.0.2.10", encrypted=False, plain_tcp_ok=False)
    exposure.check_bind("actor.0", "192.0.2.10", encrypted=True, plain_tcp_ok=False)
    exposure.check_bind("actor.0", "192.0.2.10", encrypted=False, plain_tcp_ok=True)
    exposure.check_bind("actor.0", "127.0.0.1", encrypted=False, plain_tcp_ok=False)


# ----- a local Ray --------------------------------------------------------------------
def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found.update(children)
        frontier.extend(children)
    return found


def _listening(pids: set[int]) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every listening tcp socket of ``pids`` (/proc, no tools)."""
    inodes: dict[int, int] = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes[int(target[8:-1])] = pid
        except OSError:
            continue
    out = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A" or int(fields[9]) not in inodes:  # 0A: LISTEN
                continue
            hex_ip, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_ip)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            ip = socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)
            out.append((ip, int(hex_port, 16), inodes[int(fields[9])]))
    return out


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:100]
    except OSError:
        return "?"


def test_a_local_ray_run_listens_on_loopback_only_and_believes_no_spoofed_hello(
        processes, tmp_path):
    pytest.importorskip("ray")
    topo = write_topology(tmp_path, nodes={"actor": {"replicas": 1, "args": {"envs": 4}}})
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    # Ray's session files in a directory of our own (short: Ray's Unix sockets live there)
    ray_tmp = Path(tempfile.mkdtemp(prefix="zr-", dir="/tmp"))
    try:
        _run_on_a_local_ray(processes, topo, run_dir, log, ray_tmp)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _run_on_a_local_ray(processes, topo: Path, run_dir: Path, log: Path,
                        ray_tmp: Path) -> None:
    proc = processes.start([sys.executable, "-m", "zmqrl.cli", "up", str(topo), "--engine",
                            "ray", "--run-dir", str(run_dir), "--max-steps", str(10**9),
                            "--max-seconds", "300"], log=log,
                           env={**RAY_ENV, "RAY_TMPDIR": str(ray_tmp)})

    def counting() -> bool:
        assert proc.poll() is None, log.read_text()[-4000:]
        rows = read_csv(run_dir / "metrics" / "run.csv")
        return bool(rows) and int(rows[-1]["env_steps"]) > 0

    try:
        wait_for(counting, 240, "the run to count env steps")
        out = log.read_text()
        assert "plain tcp on loopback only" in out, out[-3000:]
        address = re.search(r"supervisor at (tcp://\S+);", out).group(1)
        assert address.startswith("tcp://127.0.0.1:"), address
        # Every listening socket of the driver's process tree: Ray's GCS, raylet,
        # workers and agents, our wrappers, the nodes, the supervisor.
        tree = _descendants(proc.pid)
        names_of = {pid: _name(pid) for pid in tree - {proc.pid}}
        listening = _listening(tree)
        exposed = [(ip, port, _name(pid)) for ip, port, pid in listening
                   if not exposure.is_loopback(ip)]
        assert not exposed, exposed
        names = " ".join(_name(pid) for _, _, pid in listening)
        assert "gcs_server" in names and "raylet" in names, names  # Ray's own are there
        node_pids = {pid_of(run_dir, n) for n in ("learner", "broker", "actor")}
        assert node_pids & {pid for _, _, pid in listening}  # and our nodes' ports
        # A hello over tcp as the actor, with its real pid but no secret: rejected.
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        try:
            for frames in (
                    {"t": wire.HELLO, "label": "actor", "kind": "actor", "node": "actor",
                     "replica": 0, "incarnation": "f00d", "pid": pid_of(run_dir, "actor"),
                     "role": "acts"},
                    {"t": wire.METRICS, "label": "actor", "row": {"env_steps": 10**10},
                     "episodes": []}):
                sock.send(msgpack.packb({"v": 1, **frames, "arrays": []}))
            wait_for(lambda: log.read_text().count("supervisor: rejected report") >= 2, 20,
                     "the spoofed reports to be rejected")
        finally:
            sock.close()
        assert "without the secret" in log.read_text()
        assert proc.poll() is None and "reached" not in log.read_text()
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{log.read_text()[-4000:]}") from None
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 0, log.read_text()[-4000:]
    # (by pid and command line: a pid may be reused meanwhile)
    wait_for(lambda: not any(_name(pid) == name and name != "?"
                             for pid, name in names_of.items()),
             30, "every process of the run (Ray's included) to be gone")
