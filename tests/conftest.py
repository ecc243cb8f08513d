"""Shared fixtures: real node processes and supervisors, always stopped afterwards.

Every process a test starts runs in its own session (process group); teardown sends
SIGTERM, waits, then SIGKILLs the group, so nothing outlives the test. Sockets are ipc
files under the test's tmp_path, so parallel runs cannot collide; a test that needs tcp
takes its ports from :func:`free_base_port`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
import zmq
from machine_share import hold as machine_share_lock

from zmqrl.bus import sockets, wire

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line(
        "markers", "minutes(n): a module whose tests take about n minutes together on a "
        "loaded 2-core machine; the longest modules are handed to workers first")
    config.addinivalue_line(
        "markers", "exclusive: a learning run held to a wall-clock bound: it runs with no "
        "other test beside it on any worker (tests/machine_share.py)")


def _module_minutes(item: pytest.Item) -> float:
    mark = getattr(getattr(item, "module", None), "pytestmark", None)
    marks = mark if isinstance(mark, list) else [mark] if mark is not None else []
    return next((float(m.args[0]) for m in marks if getattr(m, "name", "") == "minutes"), 0.0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Longest modules first (xdist --dist loadfile --no-loadscope-reorder, pyproject.toml,
    # deals whole modules out in this order):
    # test_topologies.py alone is ~8 minutes, and collected in name order it started
    # last, so one worker ran it by itself while the other core idled. A stable sort:
    # each module's tests keep their order.
    items.sort(key=lambda item: -_module_minutes(item))
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch  # only when a gpu test was collected

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device (none visible to torch)")
        for item in gpu_items:
            item.add_marker(skip)


def machine(tmp_path_factory: pytest.TempPathFactory,
            exclusive: bool = False) -> contextlib.AbstractContextManager[None]:
    """The machine, alone or shared, for the ``with`` body (tests/machine_share.py);
    nothing to wait for when one process runs all the tests. A module-scoped fixture
    that runs processes while it sets up (not inside any test) holds it shared for that
    (a fixture's processes that then idle between its tests need not)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return contextlib.nullcontext()
    # the workers' base temp dirs share this parent, one per run (pytest-xdist's way
    # of sharing a file between its workers)
    return machine_share_lock(tmp_path_factory.getbasetemp().parent / "machine", exclusive)


@pytest.fixture(autouse=True)
def machine_share(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """An ``exclusive`` test has the machine to itself; any other shares it. Autouse, so
    it is set up before the test's other function-scoped fixtures and torn down after
    them: the processes they start are stopped before the machine is let go. (The wait
    counts in the test's pytest-timeout: at most the other worker's running test, then
    one exclusive run.)"""
    with machine(tmp_path_factory, request.node.get_closest_marker("exclusive") is not None):
        yield


def wait_for(predicate: Callable[[], object], timeout: float, what: str,
             interval: float = 0.05) -> object:
    """Poll ``predicate`` until it returns something truthy, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def stop_process(proc: subprocess.Popen, grace: float = 10.0) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group
    except ProcessLookupError:
        pass
    proc.wait()


def stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every process group at once, then reap each (so their shutdowns overlap)."""
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    for proc in procs:
        stop_process(proc)


class Processes:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, args: list[str], cwd: Path = REPO, log: Path | None = None,
              env: dict[str, str] | None = None) -> subprocess.Popen:
        out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115
        proc = subprocess.Popen(args, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.procs.append(proc)
        return proc

    def zmqrl(self, *args: str, log: Path | None = None) -> subprocess.Popen:
        return self.start([sys.executable, "-m", "zmqrl.cli", *args], log=log)


@pytest.fixture
def processes() -> Iterator[Processes]:
    procs = Processes()
    yield procs
    for proc in procs.procs:
        stop_process(proc)


def write_topology(tmp_path: Path, base: str = "seed.yaml", **overrides) -> Path:
    """A copy of a repository topology with ``overrides`` deep-merged in."""
    from zmqrl.run.topology import merge

    raw = yaml.safe_load((REPO / "topologies" / base).read_text())
    path = tmp_path / f"topology-{len(list(tmp_path.glob('topology-*')))}.yaml"
    path.write_text(yaml.safe_dump(merge(raw, overrides)))
    return path


class Client:
    """A DEALER speaking the wire protocol to one bound port, for tests."""

    def __init__(self, address: str):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)

    def send_raw(self, frames: list) -> None:
        self.sock.send_multipart(frames)

    def send(self, frames: list) -> None:
        sockets.send(self.sock, frames)

    def recv(self, timeout: float = 10.0) -> wire.Message:
        if not self.sock.poll(int(timeout * 1000)):
            raise AssertionError(f"no reply within {timeout}s")
        return wire.decode(self.sock.recv_multipart())

    def request(self, frames: list, timeout: float = 10.0) -> wire.Message:
        self.send(frames)
        return self.recv(timeout)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def client_factory() -> Iterator[Callable[[str], Client]]:
    clients: list[Client] = []

    def make(address: str) -> Client:
        clients.append(Client(address))
        return clients[-1]

    yield make
    for c in clients:
        c.close()


def read_csv(path: Path) -> list[dict[str, str]]:
    import csv

    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def free_base_port(count: int, host: str = "127.0.0.1") -> int:
    """A ``network.base_port`` with ``count`` consecutive free tcp ports on ``host``.

    Drawn at random below the kernel's ephemeral range (so outgoing connections do not
    take the ports meanwhile) and checked by binding each, so parallel test runs on one
    machine do not collide. Pair it with ``host:`` fields and ``network.base_port``.
    """
    import random
    import socket

    rng = random.SystemRandom()
    for _ in range(200):
        base = rng.randrange(20_000, 32_000 - count)
        probes: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                probes.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                probes[-1].bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise RuntimeError(f"no {count} consecutive free tcp ports found on {host}")


def process_argv(proc_entry: Path) -> list[str]:
    """The command line of the process at ``/proc/<pid>``, as words. A node forked from
    the supervisor's fork template (zmqrl.run.forkstart) shows its command as one
    title string, which is split as a shell would."""
    words = [w for w in (proc_entry / "cmdline").read_bytes().decode(errors="replace")
             .split("\0") if w]
    return shlex.split(words[0]) if len(words) == 1 and " " in words[0] else words


def pid_of(run_dir: Path, node: str, replica: int = 0) -> int:
    """The pid of ``node``'s replica in the run under ``run_dir`` (from /proc)."""
    marker = f" {node} --replica {replica} "
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(run_dir) in cmdline and "zmqrl.cli" in cmdline and marker in cmdline:
            return int(entry.name)
    raise LookupError(f"no process for {node}.{replica}")
