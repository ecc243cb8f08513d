"""Node processes forked from a preloaded template, so that each does not import torch.

A fresh interpreter that imports torch, numpy, zmq and gymnasium spends ~3 s of CPU
before it runs a line of the node (torch alone ~2.7 s on a 2-core machine); a 13-process
topology paid that 13 times at every start and at every restart, all at once, on the
cores its actors and learner were about to need. ``zmqrl up`` instead starts one
template process that imports those once (the stdlib's ``multiprocessing`` fork server,
started as a fresh interpreter, never a fork of the supervisor with its threads), and
every node replica is a fork of it: it begins with the modules loaded, their pages
shared copy-on-write.

The child is set up as the ``subprocess.Popen`` of ``python -m zmqrl.cli node ...`` was:
that command line as its title (``ps``, ``/proc/<pid>/cmdline``: setproctitle), its own
session, stdin from /dev/null, stdout and stderr into the pipe the supervisor reads, the
environment the supervisor gave it, ``sys.argv``, the working directory on ``sys.path``,
death with its parent (the template, which itself ends when the supervisor does), then
the CLI's ``node`` command. :class:`ForkedNode` answers the part of Popen's interface the
supervisor uses (``pid``, ``poll``, ``wait``, ``stdout``); exit codes follow Popen's (``-N``
for a signal).

Only a node that runs torch is forked (``Node.runs_torch``, which each node class answers
for its spec): one that runs no model (a remote actor, a replay) starts as a fresh
interpreter that never imports torch and stays small. ``ZMQRL_FORKSERVER=0`` makes every
node a fresh interpreter again (``subprocess``), as does ``PYTHONPROFILEIMPORTTIME``. A
node with a ``command:`` (another program) is always a plain subprocess.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterable
from multiprocessing import forkserver, reduction, resource_tracker
from typing import IO, Any

import setproctitle

ENABLE_ENV = "ZMQRL_FORKSERVER"  # "0": start every node as a fresh interpreter
# What every node imports before its first line; the topology adds its node modules.
PRELOAD = ("zmqrl.run.forktemplate", "torch", "numpy", "zmq", "gymnasium", "setproctitle",
           "zmqrl.cli", "zmqrl.run.forkstart")

_context: Any = None


def enabled() -> bool:
    """Forking is on, unless switched off, or each process's imports are being profiled
    (``PYTHONPROFILEIMPORTTIME``: a forked node imports nothing, its template did)."""
    return (os.environ.get(ENABLE_ENV, "1") != "0"
            and not os.environ.get("PYTHONPROFILEIMPORTTIME")
            and "forkserver" in multiprocessing.get_all_start_methods())


def _fork_server(modules: Iterable[str]) -> Any:
    """This process's fork-server context; its preload is set by the first caller (the
    server starts, and imports, on the first :func:`start`)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload([*PRELOAD, *modules])
    return _context


class ForkedNode:
    """A forked node: the part of ``subprocess.Popen`` the supervisor uses."""

    def __init__(self, process: Any, stdout: IO[str]):
        self._process = process
        self.pid: int = process.pid
        self.stdout = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self.poll()
        if code is None:
            raise subprocess.TimeoutExpired(f"node process {self.pid}", timeout or 0.0)
        return code


def start(command: list[str], env: dict[str, str], modules: Iterable[str] = ()) -> ForkedNode:
    """Fork what ``command`` (``python -m zmqrl.cli node ...``) would run from the template,
    with ``env`` as its whole environment; ``ps`` shows it as ``command``. ``modules``:
    more to preload (the topology's node modules), taken from the first call only."""
    if command[1:3] != ["-m", "zmqrl.cli"]:
        raise ValueError(f"not a zmqrl command: {command[:3]}")
    read, write = os.pipe()
    try:
        process = _fork_server(modules).Process(
            target=_child, args=(command, env, _PassFd(write), os.getcwd()),
            name=" ".join(command[3:5]))
        process.start()
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)  # the child holds its copy: EOF when it (and its children) end
    return ForkedNode(process, open(read, encoding="utf-8", errors="replace"))  # noqa: SIM115


class _PassFd:
    """An fd handed to the child with the start request (the fork server passes it over
    its socket); pickled only while the Process is being started."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self) -> tuple:
        return (_detach, (reduction.DupFd(self.fd),))


def _detach(dup: Any) -> int:
    return dup.detach()


def _child(command: list[str], env: dict[str, str], out: int, cwd: str) -> None:
    """In the forked child: become what ``command`` would have been, then run it (its
    SystemExit is the exit code)."""
    os.setsid()  # its own session and group: the supervisor signals the whole tree
    for sig in (signal.SIGTERM, signal.SIGHUP):  # the template ignores them (forktemplate)
        signal.signal(sig, signal.SIG_DFL)
    # Only the supervisor holds the template's lifeline: when it dies, the template ends,
    # and so (by their death signal) do its nodes. A fresh resource tracker if one is used.
    # (CPython's private names: where a version lacks them there is nothing to close.)
    for holder, name in ((forkserver._forkserver, "_forkserver_alive_fd"),
                         (resource_tracker._resource_tracker, "_fd")):
        fd = getattr(holder, name, None)
        if isinstance(fd, int):
            os.close(fd)
            setattr(holder, name, None)
    setproctitle.setproctitle(shlex.join(command))  # ps, top and /proc show the node
    from zmqrl.bus import lifetime
    from zmqrl.bus.node import PARENT_PID_ENV

    lifetime.die_with_parent(signal.SIGTERM)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (line by line)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    # The process that started it, for its ParentWatch: the template, which ends with
    # the supervisor (its kernel death signal fires then too).
    os.environ[PARENT_PID_ENV] = str(os.getppid())
    os.chdir(cwd)
    if sys.path[:1] != [cwd]:
        sys.path.insert(0, cwd)  # as ``python -m`` puts it: a user's modules beside it
    sys.argv = ["zmqrl", *command[3:]]
    # (zmqrl.cli runs again as __main__: forktemplate silences runpy's warning of it.)
    try:
        runpy.run_module("zmqrl.cli", run_name="__main__", alter_sys=True)  # python -m
    finally:
        atexit._run_exitfuncs()  # what the node registered: an interpreter's exit runs them
        sys.stdout.flush()
        sys.stderr.flush()
