"""CPU pinning on one host: a node's ``cores`` give each replica's main thread a core of
its own, and every other thread of the run on that host stays off those cores.

A SEED actor is CPU-bound on stepping its envs. Unpinned, the scheduler wakes the
broker's and the ZeroMQ I/O threads on the actor's core as often as on the other, and
each wake-up takes the actor off its core for the length of the woken thread's work;
pinned, the actor's core runs nothing else (``zmqrl bench --pin``; BENCHMARKS.md,
"Pinning", has what it gains). Sample Factory pins its rollout workers for the same
reason.

* ``cores: [c0, c1, ...]`` on a node: replica ``i``'s main thread runs on core ``ci``.
* Every other thread of every node on the same host (the pinned nodes' ZeroMQ I/O and
  writer threads included) runs on the host's cores that no node lists: the *shared*
  cores. With no ``cores`` anywhere nothing is pinned.

:func:`errors` checks a topology (any host), :func:`host_errors` the cores against the
machine the nodes run on; :func:`plan` says what one replica does, :func:`apply` and
:func:`pin_main_thread` do it (Linux; elsewhere pinning is refused by
:func:`host_errors`).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CorePlan:
    own: int | None  # this replica's main thread's core (None: not pinned)
    shared: frozenset[int]  # where the run's other threads on this host go


def _listed(topo: Any, host: str | None) -> dict[int, str]:
    """Core -> the node that lists it, over the nodes placed on ``host``."""
    out: dict[int, str] = {}
    for spec in topo.nodes.values():
        if spec.host == host:
            for core in spec.cores[:spec.replicas]:
                out.setdefault(core, spec.name)
    return out


def errors(topo: Any) -> list[tuple[tuple, str]]:
    """Problems with the ``cores`` fields whatever machine runs the topology."""
    out: list[tuple[tuple, str]] = []
    seen: dict[tuple[str | None, int], str] = {}
    for spec in topo.nodes.values():
        if not spec.cores:
            continue
        where = ("nodes", spec.name, "cores")
        if spec.command is not None:
            out.append((where, "pins a zmqrl node's main thread; a command node is "
                               "another program (pin it with taskset)"))
            continue
        if len(spec.cores) < spec.replicas:
            out.append((where, f"lists {len(spec.cores)} core(s) for {spec.replicas} "
                               "replicas (one per replica)"))
        mine = spec.cores[:spec.replicas]
        if len(set(mine)) < len(mine):
            out.append((where, "lists a core twice: each replica needs a core of its own"))
        for core in sorted(set(mine)):
            other = seen.setdefault((spec.host, core), spec.name)
            if other != spec.name:
                out.append((where, f"core {core} is already pinned by node '{other}': "
                                   "each pinned replica needs a core of its own"))
    return out


def available() -> frozenset[int]:
    """The cores this process may run on (a container's cpuset, taskset)."""
    if not hasattr(os, "sched_getaffinity"):
        return frozenset()
    return frozenset(os.sched_getaffinity(0))


def host_errors(topo: Any, host: str | None = None) -> list[str]:
    """Problems with pinning ``host``'s nodes on this machine: listed cores it lacks,
    or no core left for the other threads."""
    listed = _listed(topo, host)
    if not listed:
        return []
    cores = available()
    if not cores:
        return ["'cores' needs a Linux host (os.sched_setaffinity); remove it here"]
    out = [f"node '{node}', field 'cores': core {core} is not one this machine runs us on "
           f"(available: {_ranges(cores)})" for core, node in sorted(listed.items())
           if core not in cores]
    if not out and cores <= set(listed):
        out.append(f"'cores' pins every available core ({_ranges(cores)}): leave at least "
                   "one for the other nodes and the I/O threads")
    return out


def plan(topo: Any, name: str, replica: int) -> CorePlan | None:
    """What replica ``replica`` of node ``name`` does on this machine (None: nothing)."""
    spec = topo.nodes[name]
    listed = _listed(topo, spec.host)
    if not listed:
        return None
    own = spec.cores[replica] if replica < len(spec.cores) else None
    return CorePlan(own, available() - set(listed))


def apply(core_plan: CorePlan | None) -> None:
    """Move every thread of this process onto the shared cores (threads started later
    inherit it). :func:`host_errors` has checked that there are some."""
    if core_plan is not None:
        _move_threads(core_plan.shared)


def pin_main_thread(core_plan: CorePlan | None) -> None:
    """Put the calling thread (the node's loop) on its own core, and its other threads
    on the shared ones."""
    if core_plan is not None and core_plan.own is not None:
        os.sched_setaffinity(0, {core_plan.own})  # Linux: 0 is the calling thread
        keep_others_off(core_plan)


def keep_others_off(core_plan: CorePlan | None) -> None:
    """Move every thread of this process but the calling one onto the shared cores.
    A thread inherits its creator's cores, so one the pinned main thread started
    since (a log writer, a thread pool) would share its core: the node runtime calls
    this again with every metrics row."""
    if core_plan is not None and core_plan.own is not None:
        _move_threads(core_plan.shared, skip=threading.get_native_id())


def _move_threads(to: frozenset[int], skip: int | None = None) -> None:
    for tid in _threads():
        if tid != skip:
            try:
                os.sched_setaffinity(tid, to)
            except ProcessLookupError:
                pass  # a thread that just ended


def _threads() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def _ranges(cores: frozenset[int] | set[int]) -> str:
    return ",".join(str(c) for c in sorted(cores))


def describe(core_plan: CorePlan | None) -> str:
    """One log line's worth."""
    if core_plan is None:
        return "not pinned"
    shared = _ranges(core_plan.shared)
    if core_plan.own is None:
        return f"every thread on cores {shared} (the others are pinned to nodes)"
    return f"main thread on core {core_plan.own}, other threads on cores {shared}"
