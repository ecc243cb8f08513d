"""The Ray actor that runs one node replica on the host Ray placed it on.

``NodeHost`` is a thin shell around the ordinary ``zmqrl node`` process, so a node is
the same program under every engine:

* ``prepare``: picks a free tcp port on this host's Ray address (on loopback when the
  cluster is the driver's machine alone; :mod:`zmqrl.run.engines.exposure`) for each
  bound port, refusing a routable address in the clear unless the run allows it,
  makes the node's CURVE server keypair here (:mod:`zmqrl.run.engines.keys`) and registers
  both in the run's registry (:mod:`zmqrl.run.engines.ray_registry`). Placed again on the
  same host, it keeps its ports and keys, so the nodes linked to it just reconnect.
* ``start``: looks up the addresses of the nodes it links to (waiting, with a deadline,
  for them to register), writes them for the node (``--endpoints``, and ``servers.json``
  for CURVE) and starts ``zmqrl node`` in its own process group, dying with us
  (:mod:`zmqrl.bus.lifetime`), with the secret its hello must carry in its environment
  (``ZMQRL_NODE_SECRET``, new for every start, from the driver). Returns its pid.
* ``poll``: the node's new output lines, and its exit code once it exited (the whole
  process group is killed then, as under ``zmqrl up``).
* ``stop``: SIGTERM to the group, SIGKILL after a grace period.

It never restarts the node itself: the driver does, by the node's restart policy
(:mod:`zmqrl.run.restart`), exactly as ``zmqrl up``. Ray runs no calls into a restarting
actor here (actors are made with ``max_restarts=0``; a lost one is replaced).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zmqrl.bus import lifetime
from zmqrl.bus.endpoints import Endpoints, private_dir
from zmqrl.bus.node import PARENT_PID_ENV, SECRET_ENV
from zmqrl.run.engines import exposure, keys

MAX_LINES = 10_000  # output lines kept between two polls; older ones are dropped (counted)
PORT_TRIES = 20
REBIND_WAIT_S = 10.0  # how long a wrapper placed again waits for its old ports


@dataclass(frozen=True)
class RunSpec:
    """What every wrapper of a run is told by the driver."""

    topology_yaml: str  # the resolved topology, as the driver wrote it
    run_dir: str  # absolute; the same path on every host
    cwd: str  # the driver's working directory (used where it exists)
    supervisor: str  # tcp address of the driver's supervisor socket
    supervisor_key: bytes | None  # its CURVE public key (None: plain tcp)
    client: tuple[bytes, bytes] | None  # the run's CURVE client keypair (generated keys)
    lookup_timeout_s: float = 60.0
    loopback: bool = False  # the cluster is the driver's machine: bind loopback
    local_nodes: tuple[str, ...] = ()  # with loopback: the Ray node ids of that machine
    encrypted: bool = False  # CURVE (generated keys or the topology's own)
    plain_tcp_ok: bool = False  # --no-curve: a routable address in the clear is allowed


@dataclass(frozen=True)
class Role:
    """One node replica: what it binds and which replicas it links to."""

    label: str
    node: str
    replica: int
    binds: tuple[str, ...]  # port names
    links: dict[str, list[str]]  # "node.port" -> labels of that node's replicas
    siblings: tuple[str, ...] = ()  # labels of every replica of this node, in order
    command: tuple[str, ...] | None = None  # an external program instead of zmqrl node


def _free_port(ip: str) -> int:
    """A port nobody listens on at ``ip`` right now (the registry keeps two replicas of
    this run from taking the same one)."""
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((ip, 0))
        return s.getsockname()[1]


def _bindable(ip: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
            return True
        except OSError:
            return False


def _tcp(ip: str, port: int) -> str:
    return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"


class NodeHost:
    """One node replica's wrapper (made a Ray actor by the driver)."""

    def __init__(self, run: RunSpec, role: Role, registry: Any):
        import ray  # a Ray worker: ray is there

        self.run = run
        self.role = role
        self.registry = registry
        self.ray_ip = ray.util.get_node_ip_address()
        self.ip = exposure.bind_ip(self.ray_ip, run.loopback)  # where its ports bind
        self.node_id = ray.get_runtime_context().get_node_id()
        self.dir = Path(run.run_dir) / "ray" / role.label
        self.keys_dir = self.dir / "keys"
        self.addresses: dict[str, str] = {}
        self.key: bytes | None = None
        self.popen: subprocess.Popen | None = None
        self.exit_reported = True
        self.lines: deque[str] = deque()
        self.dropped = 0
        self._pump: threading.Thread | None = None

    # ----- placement ------------------------------------------------------------------
    def prepare(self) -> dict[str, Any]:
        """Pick ports, make keys, register; returns where this replica is."""
        import ray

        if self.run.loopback and self.node_id not in self.run.local_nodes:
            raise RuntimeError(
                f"{self.role.label}: placed on Ray node {self.ray_ip}, which joined after "
                "the run started on the driver's machine alone (its ports bind loopback); "
                "start the run again to include it")
        exposure.check_bind(self.role.label, self.ip, self.run.encrypted,
                            self.run.plain_tcp_ok)
        self.dir.mkdir(parents=True, exist_ok=True)
        private_dir(self.dir)
        topo_file = self.dir / "topology.yaml"
        tmp = topo_file.with_name(".topology.yaml.tmp")
        tmp.write_text(self.run.topology_yaml)
        tmp.replace(topo_file)
        # A server keypair even where nothing binds: the layout zmqrl.bus.security reads.
        if self.run.client is not None:
            self.key = keys.server_keypair(self.keys_dir)
        previous = ray.get(self.registry.previous.remote(self.role.label))
        wanted: dict[str, int] = {}
        if previous and previous["ip"] == self.ip:  # placed again here: keep the ports
            old = {p: int(a.rsplit(":", 1)[1]) for p, a in previous["addresses"].items()
                   if p in self.role.binds}
            # The node of the wrapper we replace may still be stopping (it got SIGTERM
            # when that wrapper died): give it a few seconds to let go of its ports.
            deadline = time.monotonic() + REBIND_WAIT_S
            while not all(_bindable(self.ip, n) for n in old.values()) and \
                    time.monotonic() < deadline:
                time.sleep(0.1)
            wanted = {p: n for p, n in old.items() if _bindable(self.ip, n)}
        for _ in range(PORT_TRIES):
            ports = {p: wanted.get(p) or _free_port(self.ip) for p in self.role.binds}
            addresses = {p: _tcp(self.ip, n) for p, n in ports.items()}
            taken = ray.get(self.registry.register.remote(
                self.role.label, self.ip, addresses, self.key.decode() if self.key else None))
            if not taken:
                self.addresses = addresses
                break
            wanted = {}
        else:
            raise RuntimeError(f"{self.role.label}: no free ports on {self.ip} after "
                               f"{PORT_TRIES} tries")
        return {"ip": self.ip, "node_id": self.node_id, "hostname": socket.gethostname(),
                "addresses": self.addresses, "pid": os.getpid()}

    # ----- the node process -----------------------------------------------------------
    def start(self, secret: str) -> int:
        """Resolve the links, write the node's endpoints and keys, start it with
        ``secret`` for its hello; its pid."""
        import ray

        if self.popen is not None and self.popen.poll() is None:
            raise RuntimeError(f"{self.role.label} is already running (pid {self.popen.pid})")
        needed = sorted({lb for labels in self.role.links.values() for lb in labels}
                        | set(self.role.siblings))
        found = ray.get(self.registry.lookup.remote(needed, self.run.lookup_timeout_s))
        if found["missing"]:
            raise RuntimeError(
                f"{self.role.label} cannot start: no address registered for "
                f"{', '.join(found['missing'])} within {self.run.lookup_timeout_s:.0f}s "
                "(not placed? see the driver's placement lines)")
        entries = found["entries"]
        # Every replica of this node (a node binds at its own replica's index) and of
        # each node it links to.
        table = {f"{self.role.node}.{p}": [entries[lb]["addresses"][p]
                                           for lb in self.role.siblings]
                 for p in self.role.binds}
        servers: dict[str, bytes] = {}
        for target, labels in self.role.links.items():
            port = target.partition(".")[2]
            table[target] = [entries[lb]["addresses"][port] for lb in labels]
            for lb in labels:
                if entries[lb]["key"]:
                    servers[entries[lb]["addresses"][port]] = entries[lb]["key"].encode()
        endpoints_file = self.dir / "endpoints.json"
        Endpoints.from_table(table).save(endpoints_file)
        command = self._command(endpoints_file)
        if self.run.client is not None:
            if self.run.supervisor_key is not None:
                servers[self.run.supervisor] = self.run.supervisor_key
            keys.write_node_keys(self.keys_dir, self.run.client, servers)
        env = dict(os.environ, PYTHONUNBUFFERED="1", ZMQRL_NODE=self.role.label,
                   ZMQRL_ENDPOINTS=str(endpoints_file), ZMQRL_SUPERVISOR=self.run.supervisor,
                   **{PARENT_PID_ENV: str(os.getpid()), SECRET_ENV: secret})
        cwd = self.run.cwd if os.path.isdir(self.run.cwd) else self.run.run_dir
        started = threading.Event()
        failure: list[BaseException] = []
        self.lines.clear()
        self._pump = threading.Thread(target=self._run, daemon=True,
                                      args=(command, env, cwd, started, failure))
        self._pump.start()
        started.wait(60)
        if failure:
            raise RuntimeError(f"{self.role.label}: cannot start {command[0]}: {failure[0]}")
        if self.popen is None:
            raise RuntimeError(f"{self.role.label}: the node process did not start in 60s")
        self.exit_reported = False
        return self.popen.pid

    def _command(self, endpoints_file: Path) -> list[str]:
        if self.role.command is not None:
            return list(self.role.command)
        cmd = [sys.executable, "-m", "zmqrl.cli", "node", str(self.dir / "topology.yaml"),
               self.role.node, "--replica", str(self.role.replica), "--run-dir",
               self.run.run_dir, "--supervisor", self.run.supervisor,
               "--endpoints", str(endpoints_file)]
        if self.run.client is not None:
            cmd += ["--set", f"network.curve.keys={self.keys_dir}"]
        return cmd

    def _run(self, command: list[str], env: dict[str, str], cwd: str,
             started: threading.Event, failure: list[BaseException]) -> None:
        """Start the node and copy its output; this thread lives as long as the node
        (the kernel's die-with-parent signal follows the thread that forked)."""
        try:
            self.popen = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, cwd=cwd, text=True, errors="replace",
                start_new_session=True, preexec_fn=lifetime.child_preexec)
        except OSError as exc:
            failure.append(exc)
            started.set()
            return
        started.set()
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            if len(self.lines) >= MAX_LINES:
                self.lines.popleft()
                self.dropped += 1
            self.lines.append(line.rstrip("\n"))
        self.popen.wait()

    def _drain(self) -> list[str]:
        out = []
        while self.lines:
            out.append(self.lines.popleft())
        return out

    def poll(self) -> dict[str, Any]:
        """New output lines; ``exit``: the node's exit code, once, when it has exited."""
        code = None
        if self.popen is not None and not self.exit_reported:
            code = self.popen.poll()
            if code is not None:
                self._reap()
        dropped, self.dropped = self.dropped, 0
        return {"lines": self._drain(), "exit": code, "dropped": dropped}

    def _reap(self) -> None:
        """The node exited: end the rest of its group, collect the last lines."""
        assert self.popen is not None
        lifetime.end_group(self.popen.pid)
        if self._pump is not None:
            self._pump.join(2.0)  # EOF follows once the group is gone
        self.exit_reported = True

    def stop(self, grace_s: float) -> dict[str, Any]:
        """Stop the node (SIGTERM, SIGKILL to its group after ``grace_s``). Its exit is
        still reported by the next ``poll`` (a node stopped to be started again)."""
        code = None
        if self.popen is not None and not self.exit_reported:
            lifetime.signal_group(self.popen.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self.popen.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            lifetime.end_group(self.popen.pid)  # the rest of its group
            code = self.popen.wait()
            if self._pump is not None:
                self._pump.join(2.0)
        return {"lines": self._drain(), "exit": code, "dropped": self.dropped}

    def pids(self) -> dict[str, int | None]:
        """This wrapper's pid and its node's (tests, diagnostics)."""
        running = self.popen is not None and self.popen.poll() is None
        return {"host": os.getpid(), "node": self.popen.pid if running else None}
