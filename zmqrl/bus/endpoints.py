"""Turn ``node.port`` names into ZeroMQ addresses, so users never pick ports.

Locally every bound port is an ipc socket file under the run directory (or, when that
path would be too long for a Unix socket, under a short directory in /tmp derived from
it, removed when the run ends: :func:`remove_ipc_dir`). A node that names a ``host``
binds tcp on that host, on a port derived from the topology's ``network.base_port``
and the port's position in the sorted list of all bound ports: every process computes
the same table from the same YAML.

An engine that places nodes itself (``up --engine ray``) resolves addresses only after
placement; it hands each node the resolved table as a file (``zmqrl node --endpoints
FILE``, :meth:`Endpoints.load`), and nodes use it exactly as a derived one.

ipc endpoints are plain (no CURVE): the directory holding the socket files is what keeps
other local users out, so it is made private (mode 0700, whatever the umask) and a
directory this user does not own, a symbolic link, or (in /tmp, where anyone may have
made it first) a directory others may write to is refused, never used.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from zmqrl.bus.spec import TopologySpec, ports_of

DEFAULT_BASE_PORT = 47100
_MAX_IPC_PATH = 100  # sun_path is 108 bytes on Linux; keep a margin


class UnsafeDirectoryError(PermissionError):
    """A directory for socket files that other local users could control."""


def private_dir(path: Path, strict_mode: bool = False) -> Path:
    """Create ``path`` (mode 0700) or check the one there; make it 0700; return it.

    Refuses (:class:`UnsafeDirectoryError`) a symbolic link, a non-directory and a
    directory of another user. ``strict_mode`` also refuses an existing directory that
    group or others may write to (rather than tightening it): where anyone can create
    it first, such a directory may already hold someone else's files. Checked on an
    ``O_NOFOLLOW`` descriptor, so the path cannot be swapped between check and chmod.
    """
    created = False
    try:
        path.mkdir(mode=0o700)
        created = True
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        what = "a symbolic link" if path.is_symlink() else f"not a directory ({exc.strerror})"
        raise UnsafeDirectoryError(f"refusing socket directory {path}: it is {what}; "
                                   "remove it if it is yours") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise UnsafeDirectoryError(
                f"refusing socket directory {path}: it belongs to uid {st.st_uid}, not to "
                f"this user (uid {os.geteuid()}); another user may be listening there")
        mode = stat.S_IMODE(st.st_mode)
        if strict_mode and not created and mode & 0o022:
            raise UnsafeDirectoryError(
                f"refusing socket directory {path}: its mode {mode:04o} lets other users "
                "write to it (it must be 0700); remove it if it is yours")
        if mode != 0o700:
            os.fchmod(fd, 0o700)  # mkdir's mode is cut by the umask; this is not
    finally:
        os.close(fd)
    return path


def ipc_dir(run_dir: str | Path) -> Path:
    """Directory for this run's ipc socket files: created, or checked, mode 0700.

    Raises :class:`UnsafeDirectoryError` when the directory is not this user's alone.
    """
    run_dir = Path(run_dir).resolve()
    candidate = run_dir / "ipc"
    if len(str(candidate)) + 40 <= _MAX_IPC_PATH:
        run_dir.mkdir(parents=True, exist_ok=True)
        return private_dir(candidate)
    # Too long for sun_path: a short name in the (world-writable, sticky) temporary
    # directory. Its name is predictable, so whoever makes it first owns it: check.
    return private_dir(_fallback_dir(run_dir), strict_mode=True)


def _fallback_dir(run_dir: Path) -> Path:
    digest = hashlib.sha1(str(run_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"zmqrl-{digest}"


def remove_ipc_dir(run_dir: str | Path, closed: tuple[str, ...] = ()) -> bool:
    """Remove the ``/tmp`` fallback directory of ``run_dir``'s socket files (see
    :func:`ipc_dir`) once nothing listens on any of them; True if it was removed.

    Called when a run ends (the supervisor, after its nodes stopped; a node run alone,
    after closing its sockets). Another process of the same run directory that still
    listens there keeps it: each socket file is probed with a connect (refused: a file
    left by a process that is gone). ``closed``: addresses the caller bound and has
    just closed (its own files, which the I/O thread may not have released yet). A
    directory holding anything but socket files, or not this user's, is left alone.
    A directory inside the run directory goes with the run directory."""
    run_dir = Path(run_dir).resolve()
    if len(str(run_dir / "ipc")) + 40 <= _MAX_IPC_PATH:
        return False
    path = _fallback_dir(run_dir)
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            return False
        ours = {Path(a.removeprefix("ipc://")).name for a in closed
                if a.startswith("ipc://") and Path(a.removeprefix("ipc://")).parent == path}
        stale = []
        for entry in os.scandir(path):
            if not stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                return False  # not a file we made
            if entry.name not in ours and _listening(entry.path):
                return False  # a live process of this run directory uses it
            stale.append(entry.path)
        for file in stale:
            os.unlink(file)
        os.rmdir(path)  # fails if a process bound a new file meanwhile: then it stays
    except OSError:
        return False
    return True


def _listening(path: str) -> bool:
    """Whether a process accepts connections on the Unix socket file ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True  # cannot tell (a full backlog, a timeout): keep it
    finally:
        probe.close()
    return True


def rendezvous_port(topo: TopologySpec) -> int:
    """The loopback tcp port where a data-parallel node with ``host:`` meets
    (:mod:`zmqrl.parts.distributed`): one per machine, so ``validate`` refuses two such
    nodes on one host."""
    return int(topo.network.get("base_port", DEFAULT_BASE_PORT)) - 1


def supervisor_address(run_dir: str | Path) -> str:
    return f"ipc://{ipc_dir(run_dir)}/supervisor"


class Endpoints:
    """Addresses of every bound port of a topology, one per replica."""

    def __init__(self, topo: TopologySpec, run_dir: str | Path):
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

    @classmethod
    def from_table(cls, table: Mapping[str, list[str]]) -> Endpoints:
        """Addresses resolved elsewhere: ``{"node.port": [address of each replica]}``."""
        self = cls.__new__(cls)
        self._table = {}
        for target, addresses in table.items():
            node, sep, port = target.partition(".")
            if not sep or not isinstance(addresses, list) or \
                    not all(isinstance(a, str) for a in addresses):
                raise ValueError(f"bad endpoints entry {target!r}: {addresses!r}")
            self._table[(node, port)] = list(addresses)
        return self

    @classmethod
    def load(cls, path: str | Path) -> Endpoints:
        """A table written by :meth:`save` (``zmqrl node --endpoints FILE``)."""
        return cls.from_table(json.loads(Path(path).read_text()))

    def table(self) -> dict[str, list[str]]:
        return {f"{node}.{port}": list(a) for (node, port), a in self._table.items()}

    def save(self, path: str | Path) -> None:
        """Write the table (atomically: a node starting meanwhile reads all or none)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.table(), indent=1, sort_keys=True))
        tmp.replace(path)

    def bind_address(self, node: str, port: str, replica: int) -> str:
        return self._table[(node, port)][replica]

    def link_addresses(self, target: str) -> list[str]:
        """All replicas of ``node.port``: a DEALER spreads requests over them."""
        node, _, port = target.partition(".")
        return list(self._table[(node, port)])
