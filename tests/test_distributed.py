"""Data-parallel learner groups (``zmqrl.parts.distributed``), as real processes.

* The group stays on loopback (defect: with ``network.curve`` on, gloo's rendezvous and
  gradients were plaintext tcp on the network): every socket a rank listens on is a
  127.0.0.1 one, for a file rendezvous and a tcp (``host:``) one, even when gloo is told
  to use another interface (as on a machine whose hostname resolves to its LAN address).
* A group killed with SIGKILL leaves its rendezvous behind; the next group must still
  form, even when its ranks start seconds apart (the stale file used to hand the late
  rank the dead group's addresses: ``connectFullMesh failed ... Connection refused``).
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import signal
import socket
import struct
import sys
import time
from pathlib import Path

import pytest

from conftest import Processes, free_base_port, stop_all, wait_for, write_topology

RANK = """
import sys, time, torch
from pathlib import Path
from zmqrl.parts import distributed
from zmqrl.run.topology import load
topo = load(sys.argv[1])
spec = topo.nodes["learner"]
rank = int(sys.argv[3])
address = distributed.rendezvous_address(topo, spec, Path(sys.argv[2]))
print("joining", address, flush=True)
distributed.init_group(address, rank, spec.replicas, timeout_s=float(sys.argv[4]))
tensors = [torch.full((3,), float(rank))]
distributed.mean_allreduce(spec.replicas)(tensors)
print("averaged", tensors[0].tolist(), flush=True)
time.sleep(600)  # stay in the group until the test stops us
"""
GROUP_TIMEOUT_S = 30.0  # the ranks' rendezvous and collective timeout


def other_interface() -> str | None:
    """A non-loopback interface with an IPv4 address, if this machine has one."""
    for _, name in socket.if_nameindex():
        if name.startswith("lo"):
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:  # SIOCGIFADDR: the interface's IPv4 address
                fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        return name
    return None


def listening(pid: int) -> list[str]:
    """The addresses (``ip:port``) of the tcp sockets process ``pid`` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if m := re.fullmatch(r"socket:\[(\d+)\]", target):
            inodes.add(m.group(1))
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # state LISTEN
                raw, port = cols[1].split(":")
                packed = bytes.fromhex(raw)
                # /proc prints the address as 32-bit words in host (little-endian) order
                words = b"".join(packed[i:i + 4][::-1] for i in range(0, len(packed), 4))
                found.append(f"{ipaddress.ip_address(words)}:{int(port, 16)}")
    return found


class Group:
    def __init__(self, processes: Processes, topo: Path, run_dir: Path, logs: Path,
                 env: dict[str, str] | None = None):
        self.processes, self.topo, self.run_dir, self.logs, self.env = (
            processes, topo, run_dir, logs, env or {})
        self.procs: dict[int, object] = {}
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, rank: int) -> None:
        self.procs[rank] = self.processes.start(
            [sys.executable, "-c", RANK, str(self.topo), str(self.run_dir), str(rank),
             str(GROUP_TIMEOUT_S)], log=self.logs / f"rank{rank}.log", env=self.env)

    def log(self, rank: int) -> str:
        path = self.logs / f"rank{rank}.log"
        return path.read_text() if path.exists() else ""

    def wait_joining(self, rank: int) -> None:
        wait_for(lambda: "joining" in self.log(rank) or self.procs[rank].poll() is not None,
                 120, f"rank {rank} to start")

    def wait_averaged(self) -> None:
        def done() -> bool:
            for rank, proc in self.procs.items():
                assert proc.poll() is None, f"rank {rank} exited:\n{self.log(rank)[-3000:]}"
            return all("averaged [0.5, 0.5, 0.5]" in self.log(r) for r in self.procs)

        try:
            wait_for(done, 120 + GROUP_TIMEOUT_S, "both ranks to average")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n" + "\n".join(
                f"--- rank {r}\n{self.log(r)[-3000:]}" for r in self.procs)) from None

    def stop(self) -> None:
        stop_all(list(self.procs.values()))


def learner_topology(tmp_path: Path, host: str | None, base_port: int = 47100) -> Path:
    learner = {"replicas": 2, **({"host": host} if host else {})}
    return write_topology(tmp_path, "ppo.yaml", network={"base_port": base_port},
                          nodes={"learner": learner})


@pytest.mark.parametrize("rendezvous", ["file", "tcp"])
def test_the_group_listens_on_loopback_only(tmp_path, processes, rendezvous):
    iface = other_interface()
    if iface is None:
        pytest.skip("no non-loopback interface to tempt gloo away from loopback")
    # With host:, rendezvous on tcp at base_port - 1 (the learners' own ports are unused).
    host = "127.0.0.1" if rendezvous == "tcp" else None
    topo = learner_topology(tmp_path, host, free_base_port(1) + 1)
    # GLOO_SOCKET_IFNAME: as on a machine whose hostname resolves to its LAN address
    group = Group(processes, topo, tmp_path / "run", tmp_path / "logs",
                  env={"GLOO_SOCKET_IFNAME": iface})
    for rank in range(2):
        group.start(rank)
    group.wait_averaged()
    for rank, proc in group.procs.items():
        addresses = listening(proc.pid)
        assert addresses, f"rank {rank} listens on nothing?"
        exposed = [a for a in addresses
                   if not ipaddress.ip_address(a.rsplit(":", 1)[0]).is_loopback]
        assert not exposed, f"rank {rank} listens beyond loopback: {addresses}"


def test_a_killed_group_leaves_no_rendezvous_that_stops_the_next(tmp_path, processes):
    topo = learner_topology(tmp_path, None)
    run_dir = tmp_path / "run"
    first = Group(processes, topo, run_dir, tmp_path / "first")
    for rank in range(2):
        first.start(rank)
    first.wait_averaged()
    for proc in first.procs.values():  # nothing of the group closes its store cleanly
        os.killpg(proc.pid, signal.SIGKILL)
    first.stop()
    # The next group's ranks start apart: rank 1 meets the rendezvous alone first.
    second = Group(processes, topo, run_dir, tmp_path / "second")
    second.start(1)
    second.wait_joining(1)
    time.sleep(3.0)  # the adverse order itself: rank 1 reads the rendezvous before rank 0
    second.start(0)
    second.wait_averaged()
