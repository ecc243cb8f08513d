"""``zmqrl node``: one node replica as a process, and the watchdog that keeps it running.

:func:`run_node` runs the node in this process, holding its label's lock in the run
directory (:class:`zmqrl.bus.lifetime.RunLock`), so a second copy of the same replica (an
orphan of a dead supervisor, a Procfile started twice) refuses to start.

:func:`watchdog` (``zmqrl node --restart-in-process``, what a Procfile line runs) runs
the node as a child process in its own process group and restarts it after any exit,
signals included (a segfaulting simulator, the OOM killer, ``kill -9``), by the node's
restart policy with the backoff ``zmqrl up`` uses (:mod:`zmqrl.run.restart`). So honcho,
which ends every process when one exits, keeps running. The watchdog forwards SIGTERM,
SIGINT and SIGHUP to the child's group, kills what is left of the group after every
exit, and the child dies with it (:mod:`zmqrl.bus.lifetime`).
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from zmqrl.bus import cores, lifetime
from zmqrl.bus.endpoints import Endpoints
from zmqrl.bus.labels import label as make_label
from zmqrl.bus.node import PARENT_PID_ENV, NodeContext
from zmqrl.run.restart import Restarts
from zmqrl.run.topology import Topology, load_class

STOP_GRACE_S = 5.0  # after forwarding a stop signal, SIGKILL the group past this


def _check(topo: Topology, name: str, replica: int) -> None:
    spec = topo.nodes[name]
    if spec.command is not None:
        raise SystemExit(f"node '{name}' is an external command; run it directly: "
                         f"{shlex.join(spec.command)}")
    if not 0 <= replica < spec.replicas:
        raise SystemExit(f"node '{name}' has {spec.replicas} replica(s); --replica {replica} "
                         "is out of range")


def run_node(topo: Topology, name: str, replica: int, run_dir: Path,
             supervisor: str | None = None, endpoints: Endpoints | None = None) -> int:
    """Run one node replica in this process until it is told to stop. ``endpoints``:
    addresses resolved by an engine after placement (default: derived from ``topo``)."""
    _check(topo, name, replica)
    spec = topo.nodes[name]
    label = make_label(name, replica, spec.replicas)
    try:
        lock = lifetime.RunLock(Path(run_dir), label).acquire()
    except lifetime.LockedError as exc:
        raise SystemExit(f"node {label} already runs in {run_dir} ({exc.holder})") from None
    try:
        problems = cores.host_errors(topo, spec.host)
        if problems:
            raise SystemExit(f"{topo.source}: " + "; ".join(problems))
        # Before the node makes its ZeroMQ context: the I/O threads inherit the cores.
        core_plan = cores.plan(topo, name, replica)
        cores.apply(core_plan)
        cls = load_class(spec.target)
        ctx = NodeContext(topo, spec, replica, Path(run_dir),
                          endpoints or Endpoints(topo, run_dir), supervisor, core_plan)
        return cls(ctx).run()
    finally:
        lock.release()


def watchdog(topo: Topology, name: str, replica: int, run_dir: Path,
             child_command: list[str]) -> int:
    """Run ``child_command`` (this node as a plain ``zmqrl node``) and restart it by the
    node's policy; returns the exit code of the last run."""
    _check(topo, name, replica)
    spec = topo.nodes[name]
    label = make_label(name, replica, spec.replicas)
    log = logging.getLogger(f"{label} watchdog")
    held = dict(lifetime.held_locks(Path(run_dir)))
    if label in held:
        raise SystemExit(f"node {label} already runs in {run_dir} ({held[label]})")
    lifetime.die_with_parent()  # our own parent (honcho, a shell) gone: so are we
    parent = lifetime.ParentWatch()
    restarts = Restarts(spec)
    child: subprocess.Popen | None = None
    stop_signal: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        if not stop_signal:
            log.info("%s received, stopping the node", signal.Signals(signum).name)
        stop_signal.append(signum)
        if child is not None:
            lifetime.signal_group(child.pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{PARENT_PID_ENV: str(os.getpid())})
    code = 0
    while not stop_signal:
        started = time.monotonic()
        child = subprocess.Popen(child_command, stdin=subprocess.DEVNULL, env=env,
                                 start_new_session=True, preexec_fn=lifetime.child_preexec)
        code = _wait(child, stop_signal, parent, log)
        lifetime.end_group(child.pid)  # whatever is left of its group
        if stop_signal:
            break
        delay = restarts.after_exit(code, time.monotonic() - started)
        if delay is None:
            log.info("node exited with %d; not restarting (restart: %s, %d restarts)",
                     code, spec.restart, restarts.count)
            break
        log.warning("node exited with %d; restart %d/%d in %.1fs", code, restarts.count,
                    spec.max_restarts, delay)
        deadline = time.monotonic() + delay
        while not stop_signal and time.monotonic() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    if stop_signal:
        return 0 if code in (0, -signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP) else 1
    return code if code >= 0 else 128 - code


def _wait(child: subprocess.Popen, stop_signal: list[int], parent: lifetime.ParentWatch,
          log: logging.Logger) -> int:
    """Wait for the child; once told to stop (or orphaned), give it STOP_GRACE_S."""
    stop_deadline: float | None = None
    while True:
        try:
            return child.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        if parent.gone() and not stop_signal:
            log.warning("the process that started us is gone; stopping the node")
            stop_signal.append(signal.SIGTERM)
            lifetime.signal_group(child.pid, signal.SIGTERM)
        if stop_signal and stop_deadline is None:
            stop_deadline = time.monotonic() + STOP_GRACE_S
        if stop_deadline is not None and time.monotonic() > stop_deadline:
            log.warning("node ignored the stop signal; killing it")
            lifetime.signal_group(child.pid, signal.SIGKILL)
