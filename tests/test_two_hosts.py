"""A run across two hosts, made of network namespaces joined by a veth pair.

Host A runs the learner and the inference broker, host B the actors, each with its own
run directory (hosts share no files); the actors reach the broker over tcp at the
address of its ``host:`` field, with CURVE on, as a real deployment would. The test
checks that experience flows, cuts the link (``ip link set ... down`` on host B),
checks that the flow stops, restores the link, and checks that the actors reconnect
and experience flows again within a deadline.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from zmqrl.bus import security

from conftest import Processes, read_csv, stop_all, wait_for, write_topology

REQUEST_TIMEOUT_S = 2.0  # the actors' Lazy Pirate: resend on a fresh socket after this
OUTAGE_S = 3 * REQUEST_TIMEOUT_S  # long enough for every actor to give up at least once
RECOVERY_DEADLINE_S = 30.0


@dataclass
class Host:
    ns: str  # network namespace
    veth: str  # its end of the link
    address: str  # its address on the link
    run_dir: Path


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _must(result: subprocess.CompletedProcess, what: str) -> None:
    if result.returncode != 0:
        pytest.skip(f"this machine does not allow {what}: {result.stderr.strip()}")


@pytest.fixture
def two_hosts(tmp_path: Path, processes: Processes) -> Iterator[tuple[Host, Host]]:
    """Two namespaces on a private /30; everything in them is gone afterwards."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2) on this machine")
    tag = f"{os.getpid()}-{secrets.token_hex(3)}"  # unique per test run
    veth = f"zq{secrets.token_hex(3)}"  # interface names: at most 15 characters
    # A random 10.x.y.z/30, so parallel runs never share a subnet (they could anyway,
    # each in its own namespaces, but it keeps logs and captures unambiguous).
    net = f"10.{secrets.randbelow(256)}.{secrets.randbelow(256)}.{4 * secrets.randbelow(64)}"
    base = net.rsplit(".", 1)[0] + "."
    last = int(net.rsplit(".", 1)[1])
    hosts = tuple(Host(f"zmqrl-test-{tag}-{side}", f"{veth}{side}", f"{base}{last + i + 1}",
                       tmp_path / f"host_{side}") for i, side in enumerate("ab"))
    created: list[str] = []
    try:
        for host in hosts:
            _must(ip("netns", "add", host.ns), "creating a network namespace")
            created.append(host.ns)
        a, b = hosts
        _must(ip("link", "add", a.veth, "netns", a.ns, "type", "veth",
                 "peer", "name", b.veth, "netns", b.ns), "creating a veth pair")
        for host in hosts:
            for cmd in (("addr", "add", f"{host.address}/30", "dev", host.veth),
                        ("link", "set", "lo", "up"), ("link", "set", host.veth, "up")):
                result = ip("-n", host.ns, *cmd)
                assert result.returncode == 0, (cmd, result.stderr)
        yield hosts
    finally:
        # Our processes first (their process groups), then anything else still inside
        # our own namespaces, then the namespaces (which takes the veth pair with them).
        stop_all(processes.procs)
        for ns in created:
            for pid in ip("netns", "pids", ns).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            ip("netns", "del", ns)


def metric(host: Host, label: str, column: str = "env_steps") -> int:
    rows = read_csv(host.run_dir / "metrics" / f"{label}.csv")
    return int(float(rows[-1][column])) if rows and rows[-1].get(column) else 0


def test_actors_on_another_host_survive_a_cut_link(tmp_path, processes, two_hosts):
    a, b = two_hosts
    security.write_keys(tmp_path / "keys")
    topo = write_topology(
        tmp_path,
        network={"curve": {"keys": "keys"}},  # relative to the topology file
        nodes={"broker": {"host": a.address},
               "actor": {"replicas": 2,
                         "args": {"envs": 4, "request_timeout_s": REQUEST_TIMEOUT_S}}},
    )

    def start(host: Host, node: str, replica: int = 0) -> None:
        label = node if node != "actor" else f"actor.{replica}"
        processes.start(["ip", "netns", "exec", host.ns, sys.executable, "-m", "zmqrl.cli",
                         "node", str(topo), node, "--replica", str(replica),
                         "--run-dir", str(host.run_dir)], log=tmp_path / f"{label}.log")

    start(a, "learner")
    start(a, "broker")
    start(b, "actor", 0)
    start(b, "actor", 1)

    def logs() -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}"
                         for p in sorted(tmp_path.glob("*.log")))

    def alive() -> None:
        dead = [p.args for p in processes.procs if p.poll() is not None]
        assert not dead, f"exited: {dead}\n{logs()}"

    def flowing(since: dict[str, int]) -> bool:
        alive()
        return (metric(a, "broker") > since["broker"] and metric(a, "learner") > since["learner"]
                and all(metric(b, f"actor.{i}") > since[f"actor.{i}"] for i in range(2)))

    def counts() -> dict[str, int]:
        return {"broker": metric(a, "broker"), "learner": metric(a, "learner"),
                **{f"actor.{i}": metric(b, f"actor.{i}") for i in range(2)}}

    # 1. Experience flows from host B's actors through host A's broker to the learner.
    try:
        wait_for(lambda: flowing(dict.fromkeys(counts(), 0)), 180,
                 "experience to flow across the link")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{logs()}") from None

    # 2. Cut the link on host B's side: the broker stops getting steps. Its metrics row
    #    comes every second; two new rows in a row with the same count mean nothing is
    #    arriving (replies in flight at the cut may still land first).
    assert ip("-n", b.ns, "link", "set", b.veth, "down").returncode == 0
    cut_rows = len(read_csv(a.run_dir / "metrics" / "broker.csv"))

    def stalled() -> int | None:
        rows = read_csv(a.run_dir / "metrics" / "broker.csv")[cut_rows:]
        if len(rows) >= 2 and rows[-1]["env_steps"] == rows[-2]["env_steps"]:
            return int(rows[-1]["env_steps"])
        return None

    stopped_at = wait_for(stalled, 20, "the flow to stop after the cut")
    time.sleep(OUTAGE_S)  # the outage itself: the actors time out and reconnect meanwhile
    alive()
    assert metric(a, "broker") == stopped_at, "steps arrived through a cut link"
    during = counts()

    # 3. Restore it: the actors' fresh connections get through, and experience flows
    #    again end to end, within the deadline.
    assert ip("-n", b.ns, "link", "set", b.veth, "up").returncode == 0
    restored = time.monotonic()
    try:
        wait_for(lambda: flowing(during), RECOVERY_DEADLINE_S,
                 "experience to flow again after the link came back")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{logs()}") from None
    recovery_s = time.monotonic() - restored
    for i in range(2):
        actor_log = (tmp_path / f"actor.{i}.log").read_text()
        assert f"no reply in {REQUEST_TIMEOUT_S:.1f}s; reconnecting and resending" in actor_log
    print(f"experience flowed again {recovery_s:.1f}s after the link came back")
