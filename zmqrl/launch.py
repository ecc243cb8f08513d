"""Running topologies: the ``zmqrl up`` supervisor, ``zmqrl node``, and Procfile export.

The supervisor starts every node replica as its own process (in its own process group,
so a whole node tree can be signalled), prefixes and colours its log lines, keeps a
per-node log file, listens on an ipc ROUTER for hello/heartbeat/metrics, shows a live
progress line, restarts nodes by their restart policy, and stops everything on a
signal or when a stop condition is met. It never leaves a child behind: SIGTERM first,
SIGKILL to the process group after a grace period.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml
import zmq
from rich.console import Console
from rich.live import Live
from rich.text import Text

from zmqrl import sockets, wire
from zmqrl.endpoints import Endpoints, supervisor_address
from zmqrl.node import NodeContext
from zmqrl.topology import Topology, load_class

STOP_GRACE_S = 5.0
SILENT_AFTER_S = 10.0  # no heartbeat for this long: the node is reported silent
_COLOURS = ["cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan",
            "bright_magenta", "bright_green", "bright_yellow"]


def default_run_dir(topo: Topology, timestamped: bool = True) -> Path:
    stamp = time.strftime("-%Y%m%d-%H%M%S") if timestamped else ""
    return Path("runs") / f"{topo.name}{stamp}"


# ----- one node ----------------------------------------------------------------------
def run_node(topo: Topology, name: str, replica: int, run_dir: Path,
             supervisor: str | None = None, in_process_restarts: bool = False) -> int:
    """Run one node replica in this process until it is told to stop.

    With ``in_process_restarts`` (``zmqrl node`` under honcho, which ends the whole
    Procfile when one process exits) a node that raises is rebuilt, fresh incarnation,
    according to its restart policy.
    """
    spec = topo.nodes[name]
    if spec.command is not None:
        raise SystemExit(f"node '{name}' is an external command; run it directly: "
                         f"{shlex.join(spec.command)}")
    if not 0 <= replica < spec.replicas:
        raise SystemExit(f"node '{name}' has {spec.replicas} replica(s); --replica {replica} "
                         "is out of range")
    cls = load_class(spec.target)
    ctx = NodeContext(topo, spec, replica, Path(run_dir), Endpoints(topo, run_dir), supervisor)
    restarts = 0
    while True:
        try:
            return cls(ctx).run()
        except Exception:
            if not in_process_restarts or spec.restart == "never" or restarts >= spec.max_restarts:
                raise
            restarts += 1
            delay = min(0.5 * 2**restarts, 10.0)
            logging.getLogger(ctx.label).exception(
                "crashed; restart %d/%d in %.1fs", restarts, spec.max_restarts, delay)
            time.sleep(delay)


def procfile(topo: Topology, topology_path: str, run_dir: str) -> str:
    lines = []
    for name, spec in topo.nodes.items():
        for replica in range(spec.replicas):
            label = name if spec.replicas == 1 else f"{name}_{replica}"
            if spec.command is not None:
                cmd = shlex.join(spec.command)
            else:
                cmd = (f"zmqrl node {shlex.quote(topology_path)} {name} --replica {replica} "
                       f"--run-dir {shlex.quote(run_dir)} --restart-in-process")
            lines.append(f"{label}: {cmd}")
    return "\n".join(lines) + "\n"


# ----- the supervisor ----------------------------------------------------------------
@dataclass
class _Proc:
    node: str
    replica: int
    label: str
    colour: str
    popen: subprocess.Popen | None = None
    restarts: int = 0
    restart_at: float | None = None
    last_heartbeat: float = field(default_factory=time.monotonic)
    reported_silent: bool = False
    failed: bool = False  # failed for good
    log_file: IO[str] | None = None
    pumps: list[threading.Thread] = field(default_factory=list)


@dataclass
class StopConditions:
    max_steps: int | None = None
    max_seconds: float | None = None
    target_return: float | None = None
    window: int = 100


class Supervisor:
    def __init__(self, topo: Topology, run_dir: Path, stop: StopConditions,
                 console: Console | None = None):
        self.topo = topo
        self.run_dir = Path(run_dir)
        self.stop = stop
        self.console = console or Console(highlight=False, soft_wrap=True)
        self.procs: list[_Proc] = []
        self.env_steps: dict[str, int] = {}  # label -> env steps reported by an actor
        self.returns: deque[float] = deque(maxlen=stop.window)
        self.returns_20: deque[float] = deque(maxlen=20)
        self.episodes = 0
        self.learner_row: dict[str, Any] = {}
        self.stopping = False
        self.reason = ""
        self.exit_code = 0
        self.started = time.monotonic()
        self._rate = (self.started, 0)
        self.steps_per_s = 0.0

    # -- lifecycle --
    def run(self) -> int:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        topo_file = self.run_dir / "topology.yaml"
        topo_file.write_text(yaml.safe_dump(self.topo.to_dict(), sort_keys=False))
        self.topo_file = topo_file
        zctx = zmq.Context.instance()
        self.address = supervisor_address(self.run_dir)
        Path(self.address[6:]).unlink(missing_ok=True)
        self.sock = sockets.bind(zctx, "router", self.address, sockets.SocketOptions(hwm=10_000))
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        for i, (name, spec) in enumerate(self.topo.nodes.items()):
            for replica in range(spec.replicas):
                label = name if spec.replicas == 1 else f"{name}.{replica}"
                self.procs.append(_Proc(name, replica, label, _COLOURS[i % len(_COLOURS)]))
        self.console.print(f"zmqrl up: {self.topo.name} -> {self.run_dir}", markup=False)
        for proc in self.procs:
            self._spawn(proc)
        live = Live(self._progress(), console=self.console, refresh_per_second=4,
                    transient=True) if self.console.is_terminal else None
        try:
            if live:
                live.start()
            last_plain = time.monotonic()
            while not self.stopping:
                self._receive(timeout_ms=100)
                self._check_children()
                self._check_stop_conditions()
                if live:
                    live.update(self._progress())
                elif time.monotonic() - last_plain > 5.0:
                    last_plain = time.monotonic()
                    self.console.print(self._progress(), markup=False)
        finally:
            if live:
                live.stop()
            self._shutdown()
        self.console.print(self._progress(), markup=False)
        self.console.print(f"zmqrl up: stopped ({self.reason}); run directory {self.run_dir}",
                           markup=False)
        return self.exit_code

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._finish(f"{signal.Signals(signum).name} received", 0)

    def _finish(self, reason: str, code: int) -> None:
        if not self.stopping:
            self.stopping = True
            self.reason = reason
            self.exit_code = code

    def _spawn(self, proc: _Proc) -> None:
        cmd = self._command(proc)
        if proc.log_file is None:
            proc.log_file = open(self.run_dir / "logs" / f"{proc.label}.log", "a")  # noqa: SIM115
        env = dict(os.environ, PYTHONUNBUFFERED="1", ZMQRL_NODE=proc.label)
        proc.popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=env, text=True,
                                      start_new_session=True)
        proc.last_heartbeat = time.monotonic()
        proc.reported_silent = False
        pump = threading.Thread(target=self._pump, args=(proc, proc.popen), daemon=True)
        pump.start()
        proc.pumps.append(pump)

    def _command(self, proc: _Proc) -> list[str]:
        spec = self.topo.nodes[proc.node]
        if spec.command is not None:
            return list(spec.command)
        return [sys.executable, "-m", "zmqrl.cli", "node", str(self.topo_file), proc.node,
                "--replica", str(proc.replica), "--run-dir", str(self.run_dir),
                "--supervisor", self.address]

    def _pump(self, proc: _Proc, popen: subprocess.Popen) -> None:
        """Copy one child's output to its log file and, prefixed and coloured, to us."""
        width = max(len(p.label) for p in self.procs)
        assert popen.stdout is not None
        for line in popen.stdout:
            line = line.rstrip("\n")
            stamp = time.strftime("%H:%M:%S")
            proc.log_file.write(f"{stamp} {line}\n")
            proc.log_file.flush()
            text = Text(f"{stamp} {proc.label.ljust(width)} | ", style=proc.colour)
            text.append(line)
            self.console.print(text)

    # -- messages from nodes --
    def _receive(self, timeout_ms: int) -> None:
        if not self.sock.poll(timeout_ms):
            return
        for _ in range(1000):
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            _, body = sockets.split_envelope(self.sock, frames)
            try:
                msg = wire.decode(body)
            except wire.ProtocolError as exc:
                self.console.print(f"supervisor: rejected message: {exc}", markup=False)
                continue
            self._handle(msg)

    def _handle(self, msg: wire.Message) -> None:
        label = msg.fields.get("label") or ""
        proc = self._proc_by_label(label)
        if proc is not None:
            proc.last_heartbeat = time.monotonic()
        if msg.type != wire.METRICS:
            return
        row = msg.fields.get("row") or {}
        episodes = msg.fields.get("episodes") or []
        self.returns.extend(episodes)
        self.returns_20.extend(episodes)
        self.episodes += len(episodes)
        node = label.split(".")[0]
        kind = self.topo.nodes[node].kind if node in self.topo.nodes else None
        if kind == "actor" and "env_steps" in row:
            self.env_steps[label] = int(row["env_steps"])
        if kind == "learner":
            self.learner_row = row

    def _proc_by_label(self, label: str) -> _Proc | None:
        return next((p for p in self.procs if p.label == label), None)

    # -- children --
    def _check_children(self) -> None:
        now = time.monotonic()
        for proc in self.procs:
            if proc.failed:
                continue
            if proc.popen is None:
                if proc.restart_at is not None and now >= proc.restart_at:
                    proc.restart_at = None
                    self._spawn(proc)
                continue
            code = proc.popen.poll()
            if code is None:
                if now - proc.last_heartbeat > SILENT_AFTER_S and not proc.reported_silent:
                    proc.reported_silent = True
                    self.console.print(f"supervisor: {proc.label} silent for "
                                       f"{now - proc.last_heartbeat:.0f}s", markup=False)
                continue
            proc.popen = None
            self._on_exit(proc, code, now)

    def _on_exit(self, proc: _Proc, code: int, now: float) -> None:
        spec = self.topo.nodes[proc.node]
        wants_restart = spec.restart == "always" or (spec.restart == "on-failure" and code != 0)
        if wants_restart and proc.restarts < spec.max_restarts:
            proc.restarts += 1
            delay = min(0.5 * 2 ** (proc.restarts - 1), 10.0)
            proc.restart_at = now + delay
            self.console.print(f"supervisor: {proc.label} exited with {code}; restart "
                               f"{proc.restarts}/{spec.max_restarts} in {delay:.1f}s",
                               markup=False)
        elif code != 0:
            proc.failed = True
            self._finish(f"{proc.label} failed for good (exit {code}, "
                         f"{proc.restarts} restarts)", 1)
        else:
            proc.failed = True  # finished; nothing to restart
            self.console.print(f"supervisor: {proc.label} finished", markup=False)

    # -- stop conditions and progress --
    @property
    def total_env_steps(self) -> int:
        if self.env_steps:
            return sum(self.env_steps.values())
        return int(self.learner_row.get("env_steps", 0) or 0)

    def mean_return(self, last: int | None = None) -> float:
        values = self.returns_20 if last == 20 else self.returns
        return sum(values) / len(values) if values else math.nan

    def _check_stop_conditions(self) -> None:
        s = self.stop
        if s.max_seconds is not None and time.monotonic() - self.started >= s.max_seconds:
            self._finish(f"--max-seconds {s.max_seconds:g} reached", 0)
        if s.max_steps is not None and self.total_env_steps >= s.max_steps:
            self._finish(f"--max-steps {s.max_steps} reached", 0)
        if (s.target_return is not None and len(self.returns) >= s.window
                and self.mean_return() >= s.target_return):
            self._finish(f"target return {s.target_return:g} reached: mean of the last "
                         f"{s.window} episodes {self.mean_return():.1f}", 0)

    def _progress(self) -> Text:
        now = time.monotonic()
        t0, steps0 = self._rate
        if now - t0 >= 1.0:
            self.steps_per_s = (self.total_env_steps - steps0) / (now - t0)
            self._rate = (now, self.total_env_steps)
        row = self.learner_row
        parts = [
            f"{now - self.started:6.1f}s",
            f"env steps {self.total_env_steps:,}",
            f"{self.steps_per_s:,.0f} steps/s",
            f"episodes {self.episodes}",
            f"return(20) {self.mean_return(20):.1f}",
            f"return(100) {self.mean_return():.1f}",
        ]
        if row:
            parts.append(f"updates {row.get('updates', 0)}")
            if row.get("policy_lag") is not None:
                parts.append(f"lag {row.get('policy_lag')}")
        return Text(" | ".join(parts), style="bold")

    def _shutdown(self) -> None:
        live = [p for p in self.procs if p.popen is not None and p.popen.poll() is None]
        for proc in live:
            _signal_group(proc.popen, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in live:
            try:
                proc.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.console.print(f"supervisor: {proc.label} ignored SIGTERM; killing",
                                   markup=False)
        for proc in self.procs:
            if proc.popen is not None:
                _signal_group(proc.popen, signal.SIGKILL)  # the group: grandchildren too
                proc.popen.wait()
            for pump in proc.pumps:
                pump.join(timeout=1.0)  # EOF follows the child's exit
            if proc.log_file:
                proc.log_file.close()
        self.sock.close(linger=0)
        Path(self.address[6:]).unlink(missing_ok=True)


def _signal_group(popen: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(popen.pid, sig)
    except ProcessLookupError:
        pass
