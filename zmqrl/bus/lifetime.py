"""Process lifetime: no node outlives whoever runs it, and one run directory has one run.

* :func:`die_with_parent` (Linux ``prctl(PR_SET_PDEATHSIG)``): the kernel signals a
  process when the one that started it dies, by any means (SIGKILL, the OOM killer).
  The supervisor and the ``zmqrl node`` watchdog set it in every child between fork and
  exec (:func:`child_preexec`), so external ``command`` nodes get it too; built-in
  nodes also watch their parent's pid (:class:`ParentWatch`), which covers a parent
  that died before the child could ask, and systems without prctl.
* :class:`RunLock`: an ``flock`` on a file in the run directory, held for as long as
  its process lives (the kernel drops it on any exit, so a crash never leaves a stale
  lock). The supervisor holds ``locks/supervisor.lock``; every node process holds
  ``locks/<label>.lock``. ``up`` refuses a run directory where any of them is held, and
  ``zmqrl node`` refuses to start a replica that already runs (under honcho or on
  another host each node process guards its own label, so no lock spans hosts).
* :func:`exit_now`: how ``zmqrl up`` and ``zmqrl node`` end once their work is done, and
  every forked node: what an interpreter's exit does for the program, not its teardown.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import fcntl
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) \
    if sys.platform.startswith("linux") else None

LOCK_DIR = "locks"
SUPERVISOR_LOCK = "supervisor"


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux)."""
    if _libc is None:
        return False
    return _libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def exit_now(code: int) -> NoReturn:
    """Exit with ``code`` as the interpreter would for the program (its other non-daemon
    threads joined, the atexit handlers run: logging's flush among them; stdout and
    stderr flushed) but without its teardown, which with torch loaded spends ~1 s of CPU
    freeing memory the kernel frees at once."""
    main = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main and thread is not threading.current_thread() \
                and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    os._exit(code)


def child_preexec() -> None:
    """``preexec_fn`` of every node process: die with the parent. (Only an async-signal
    -safe system call runs between fork and exec here.)"""
    die_with_parent(signal.SIGTERM)


class ParentWatch:
    """Tells whether the process that started us is gone (we were re-parented)."""

    def __init__(self, parent_pid: int | None = None):
        self.parent_pid = parent_pid if parent_pid is not None else os.getppid()

    def gone(self) -> bool:
        return os.getppid() != self.parent_pid


def signal_group(pgid: int, sig: int) -> bool:
    """Signal a whole process group; False if no process is left in it."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def end_group(pgid: int, timeout_s: float = 2.0) -> bool:
    """SIGKILL a whole process group and wait (up to ``timeout_s``) until none of its
    processes still runs; True once the group is gone.

    A node's exit ends its group before the node is restarted or reported gone: a
    grandchild holding a port, a file or GPU memory must not overlap its successor.
    SIGKILL is delivered asynchronously (a loaded machine may take a while to schedule the
    dying process), hence the wait. Zombies count as gone: whoever reaps them (init, once
    their parent died) is not ours to wait for."""
    if not signal_group(pgid, signal.SIGKILL):
        return True
    deadline = time.monotonic() + timeout_s
    while _group_runs(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _group_runs(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies excluded; Linux reads
    /proc, elsewhere any member counts)."""
    if not sys.platform.startswith("linux"):
        return signal_group(pgid, 0)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


class LockedError(Exception):
    """Another live process holds the lock."""

    def __init__(self, path: Path, holder: str):
        super().__init__(f"{path} is held by {holder}")
        self.path = path
        self.holder = holder


def lock_path(run_dir: Path, name: str) -> Path:
    return Path(run_dir) / LOCK_DIR / f"{name}.lock"


class RunLock:
    """An exclusive, non-blocking ``flock`` on ``locks/<name>.lock`` in a run directory.

    The file keeps the holder's pid for messages; the lock itself is the kernel's, so it
    is released on any exit and never inherited by children (the descriptor is not
    inheritable)."""

    def __init__(self, run_dir: Path, name: str):
        self.path = lock_path(run_dir, name)
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise LockedError(self.path, holder) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *_exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid else "another process"


def held_locks(run_dir: Path) -> list[tuple[str, str]]:
    """(name, holder) of every lock in ``run_dir`` that a live process holds."""
    held = []
    directory = Path(run_dir) / LOCK_DIR
    if not directory.is_dir():
        return held
    for path in sorted(directory.glob("*.lock")):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            held.append((path.stem, _read_holder(fd)))
        finally:
            os.close(fd)  # also drops our probe's shared lock
    return held
