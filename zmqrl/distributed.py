"""Data-parallel learners: the replicas of one learner node form a torch.distributed
process group (gloo backend, CPU or CUDA tensors) and average their gradients every
step, so their parameters stay identical (OpenAI Five's synchronous optimizers).

Rendezvous follows the topology's addresses, so nobody picks a port:

* a learner node without ``host:`` (one machine) meets through a file store in the
  run directory (no tcp port that parallel runs could fight over);
* a learner node with ``host:`` meets on tcp at replica 0's host, port
  ``network.base_port - 1`` (the port just below the topology's port block).

Rank = replica index, world size = replicas. Collective calls time out after
``timeout_s``: a rank whose peer died raises instead of waiting for ever, and the
supervisor's restart policy takes over.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from zmqrl.endpoints import DEFAULT_BASE_PORT
from zmqrl.topology import NodeSpec, Topology

log = logging.getLogger(__name__)

AllReduce = Callable[[list[torch.Tensor]], None]


def rendezvous_address(topo: Topology, spec: NodeSpec, run_dir: Path) -> str:
    if spec.host:
        port = topo.network.get("base_port", DEFAULT_BASE_PORT) - 1
        return f"tcp://{spec.host}:{port}"
    path = Path(run_dir).resolve() / "rendezvous" / spec.name
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"file://{path}"


def init_group(address: str, rank: int, world: int, timeout_s: float = 120.0) -> None:
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
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
