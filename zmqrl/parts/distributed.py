"""Data-parallel learners: the replicas of one learner node form a torch.distributed
process group (gloo for models on the CPU, NCCL on CUDA, one GPU per replica) and
average their gradients every step, so their parameters stay identical (OpenAI Five's
synchronous optimizers).

Every replica of a node binds at the same address (one ``host:`` for all of them,
protocol.md §2), so the replicas of a learner node always share one machine, and the
group never needs to leave it: rendezvous and gradients stay on loopback. That matters
because gloo has no encryption or authentication of its own: with ``network.curve`` on,
everything else between hosts is CURVE, and this must not be plaintext tcp beside it.

* Rendezvous follows the topology, so nobody picks a port. A learner node without
  ``host:`` meets through a file store in the run directory (private, like the ipc
  sockets); one with ``host:`` (whose replicas may not share a run directory) meets on
  tcp at 127.0.0.1, port ``network.base_port - 1``, the store listening on loopback
  only (torch's own store would listen on every interface). That port is one per
  machine: ``validate`` refuses two such nodes on one host.
* gloo's connections between the ranks use the loopback interface
  (``GLOO_SOCKET_IFNAME``), not whatever address the machine's hostname resolves to.
* A file store left behind by a killed group would hand its stale peer addresses to the
  next one (torch removes the file only when every rank closes it cleanly). So each
  group meets in a fresh file, ``<name>.<generation>``: a replica joining a generation
  that its own rank already joined, or one whose members' processes are gone, starts
  the next generation instead (under a lock, in ``<name>.json``).

Rank = replica index, world size = replicas. Collective calls time out after
``timeout_s``: a rank whose peer died raises instead of waiting for ever, and the
supervisor's restart policy takes over.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from zmqrl.bus.endpoints import private_dir, rendezvous_port
from zmqrl.bus.spec import NodeSpec, TopologySpec
from zmqrl.bus.status import pid_alive

log = logging.getLogger(__name__)

AllReduce = Callable[[list[torch.Tensor]], None]
LOOPBACK = "127.0.0.1"


def rendezvous_address(topo: TopologySpec, spec: NodeSpec, run_dir: Path) -> str:
    """Where the replicas of ``spec`` meet: ``tcp://127.0.0.1:PORT`` or ``file://PATH``."""
    if spec.host:
        return f"tcp://{LOOPBACK}:{rendezvous_port(topo)}"
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    return f"file://{private_dir(run_dir / 'rendezvous') / spec.name}"


def _loopback_interface() -> str:
    names = {name for _, name in socket.if_nameindex()}
    for name in ("lo", "lo0"):  # Linux, BSD/macOS
        if name in names:
            return name
    raise RuntimeError(f"no loopback interface among {sorted(names)} for the gloo group")


def _tcp_store(address: str, rank: int, world: int,
               timeout: datetime.timedelta) -> dist.Store:
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    if rank != 0:
        return dist.TCPStore(host, int(port), world, is_master=False, timeout=timeout)
    # torch's TCPStore server binds every interface; hand it a socket bound to this one.
    listener = socket.create_server((host, int(port)))
    return dist.TCPStore(host, int(port), world, is_master=True, timeout=timeout,
                         master_listen_fd=listener.detach())


def _generation(base: Path, rank: int) -> int:
    """The generation of ``base``'s file store this rank joins (see the module doc)."""
    state_file = base.with_name(f"{base.name}.json")
    with open(base.with_name(f"{base.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        try:
            state = json.loads(state_file.read_text())
            generation = int(state["generation"])
            joined = {str(r): int(pid) for r, pid in state["joined"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            generation, joined = 0, {}  # none yet, or unreadable: start afresh
        if not joined or str(rank) in joined or not all(map(pid_alive, joined.values())):
            generation += 1
            joined = {}
            for old in base.parent.glob(f"{base.name}.*"):
                if old.suffix[1:].isdigit() and int(old.suffix[1:]) < generation:
                    old.unlink(missing_ok=True)
        joined[str(rank)] = os.getpid()
        tmp = state_file.with_name(f"{state_file.name}.tmp")
        tmp.write_text(json.dumps({"generation": generation, "joined": joined}))
        os.replace(tmp, state_file)
    return generation


def _file_store(base: Path, rank: int, world: int,
                timeout: datetime.timedelta) -> dist.Store:
    path = base.with_name(f"{base.name}.{_generation(base, rank)}")
    store = dist.FileStore(str(path), world)
    store.set_timeout(timeout)
    return store


def init_group(address: str, rank: int, world: int, timeout_s: float = 120.0,
               backend: str = "gloo") -> None:
    """Join the group of ``world`` ranks meeting at ``address`` (``rendezvous_address``),
    over ``backend``: ``gloo`` (CPU tensors) or ``nccl`` (CUDA tensors, one GPU per
    rank). Either keeps its connections on the loopback interface."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    timeout = datetime.timedelta(seconds=timeout_s)
    loopback = _loopback_interface()
    os.environ["GLOO_SOCKET_IFNAME"] = loopback  # read when gloo starts
    os.environ["NCCL_SOCKET_IFNAME"] = loopback  # NCCL's bootstrap and socket transport
    if address.startswith("tcp://"):
        store = _tcp_store(address, rank, world, timeout)
    elif address.startswith("file://"):
        store = _file_store(Path(address.removeprefix("file://")), rank, world, timeout)
    else:
        raise ValueError(f"unknown rendezvous address {address!r}")
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    log.info("rank %d of %d joined at %s", rank, world, address)


def mean_allreduce(world: int) -> AllReduce:
    """Averages a list of tensors in place across the group, in one collective call
    (one flat buffer: per-tensor calls would cost a round trip each)."""

    def allreduce(tensors: list[torch.Tensor]) -> None:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    return allreduce


def leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
