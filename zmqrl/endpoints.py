"""Turn ``node.port`` names into ZeroMQ addresses, so users never pick ports.

Locally every bound port is an ipc socket file under the run directory (or, when that
path would be too long for a Unix socket, under a short directory in /tmp derived from
it). A node that names a ``host`` binds tcp on that host, on a port derived from the
topology's ``network.base_port`` and the port's position in the sorted list of all
bound ports: every process computes the same table from the same YAML.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from zmqrl.topology import Topology, ports_of

DEFAULT_BASE_PORT = 47100
_MAX_IPC_PATH = 100  # sun_path is 108 bytes on Linux; keep a margin


def ipc_dir(run_dir: str | Path) -> Path:
    """Directory for this run's ipc socket files (created on demand)."""
    run_dir = Path(run_dir).resolve()
    candidate = run_dir / "ipc"
    if len(str(candidate)) + 40 > _MAX_IPC_PATH:
        digest = hashlib.sha1(str(run_dir).encode()).hexdigest()[:12]
        candidate = Path(tempfile.gettempdir()) / f"zmqrl-{digest}"
    candidate.mkdir(parents=True, exist_ok=True)
    return candidate


def supervisor_address(run_dir: str | Path) -> str:
    return f"ipc://{ipc_dir(run_dir)}/supervisor"


class Endpoints:
    """Addresses of every bound port of a topology, one per replica."""

    def __init__(self, topo: Topology, run_dir: str | Path):
        self._table: dict[tuple[str, str], list[str]] = {}
        base_port = topo.network.get("base_port", DEFAULT_BASE_PORT)
        directory = ipc_dir(run_dir)
        slot = 0
        for name in sorted(topo.nodes):
            spec = topo.nodes[name]
            for port in sorted(ports_of(spec)):
                addresses = []
                for replica in range(spec.replicas):
                    if spec.host:
                        addresses.append(f"tcp://{spec.host}:{base_port + slot}")
                        slot += 1
                    else:
                        addresses.append(f"ipc://{directory}/{name}-{replica}-{port}")
                self._table[(name, port)] = addresses

    def bind_address(self, node: str, port: str, replica: int) -> str:
        return self._table[(node, port)][replica]

    def link_addresses(self, target: str) -> list[str]:
        """All replicas of ``node.port``: a DEALER spreads requests over them."""
        node, _, port = target.partition(".")
        return list(self._table[(node, port)])
