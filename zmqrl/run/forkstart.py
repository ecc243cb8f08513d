"""Node processes forked from a preloaded template, so that each does not import torch.

A fresh interpreter that imports torch, numpy, zmq and gymnasium spends ~3 s of CPU
before it runs a line of the node (torch alone ~2.7 s on a 2-core machine); a 13-process
topology paid that 13 times at every start and at every restart, all at once, on the
cores its actors and learner were about to need. Instead, ``zmqrl up`` (and ``bench``)
call :func:`open_template` first thing: it imports those modules in the supervisor,
which needs torch anyway to check the topology's models, and forks the **template**
there and then: a copy of the supervisor taken while it is still one Python thread that
has run no torch op, opened no zmq context and holds no lock or run file. The template
serves fork requests over a socket pair, and every node replica is a fork of it: it
begins with the modules loaded, their pages shared copy-on-write, and no interpreter of
its own to start. (Forking the supervisor later would copy its threads' locks and
torch's thread pool half-made; a fork server started as a fresh interpreter, as the
stdlib's ``multiprocessing`` one is, pays the whole import again.)

The child is set up as the ``subprocess.Popen`` of ``python -m zmqrl.cli node ...`` was:
that command line as its title (``ps``, ``/proc/<pid>/cmdline``: setproctitle), its own
session, stdin from /dev/null, stdout and stderr into the pipe the supervisor reads, the
environment the supervisor gave it, ``sys.argv``, the working directory on ``sys.path``,
death with its parent (the template, which itself ends when the supervisor does: the
socket closes, or its own death signal fires), then the CLI's ``node`` command.
:class:`ForkedNode` answers the part of Popen's interface the supervisor uses (``pid``,
``poll``, ``wait``, ``stdout``); exit codes follow Popen's (``-N`` for a signal): the
template reaps its children and sends each one's code back.

Only a node that runs torch is forked (``Node.runs_torch``, which each node class answers
for its spec): one that runs no model (a remote actor, a replay) starts as a fresh
interpreter that never imports torch and stays small. ``ZMQRL_FORKSERVER=0`` makes every
node a fresh interpreter again (``subprocess``), as does ``PYTHONPROFILEIMPORTTIME``, and
so does a process that opened no template (a supervisor run from a user's own code). A
node with a ``command:`` (another program) is always a plain subprocess.

The wire between supervisor and template (a ``SOCK_SEQPACKET`` pair, one pickle a
message): the supervisor sends ``(command, env, cwd, modules)`` with the write end of the
node's output pipe attached (``SCM_RIGHTS``); the template answers ``("started", pid)`` or
``("failed", reason)``, and later ``("exited", pid, code)`` for each child it reaps.
"""

from __future__ import annotations

import importlib
import os
import pickle
import runpy
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import threading
import traceback
import warnings
from collections.abc import Iterable
from typing import IO

ENABLE_ENV = "ZMQRL_FORKSERVER"  # "0": start every node as a fresh interpreter
# What every node imports before its first line; each request adds its node modules.
PRELOAD = ("torch", "numpy", "zmq", "gymnasium", "setproctitle", "zmqrl.cli")
_MESSAGE_MAX = 1 << 20  # a request: a command, an environment, a few module names


def enabled() -> bool:
    """Forking is on, unless switched off, or each process's imports are being profiled
    (``PYTHONPROFILEIMPORTTIME``: a forked node imports nothing, its template did)."""
    return (os.environ.get(ENABLE_ENV, "1") != "0"
            and not os.environ.get("PYTHONPROFILEIMPORTTIME") and hasattr(os, "fork"))


class TemplateGone(OSError):
    """The template is not there to fork from (it died, or none was opened)."""


# ----- the supervisor's side -------------------------------------------------------------
class ForkedNode:
    """A forked node: the part of ``subprocess.Popen`` the supervisor uses."""

    def __init__(self, template: _Template, pid: int, stdout: IO[str]):
        self._template = template
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._template.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._template.wait(self.pid, timeout)
        return self.returncode


class _Template:
    """The supervisor's handle on its template: requests go one at a time; a reader
    thread takes the answers and the exit codes."""

    def __init__(self, pid: int, sock: socket.socket):
        self.pid, self._sock = pid, sock
        self._request = threading.Lock()  # one start at a time: answers come in order
        self._changed = threading.Condition()
        self._answers: list[tuple] = []
        self._exits: dict[int, int] = {}
        self._children: set[int] = set()
        self.alive = True
        threading.Thread(target=self._read, name="fork-template", daemon=True).start()

    def start(self, command: list[str], env: dict[str, str], cwd: str,
              modules: Iterable[str], out: int) -> int:
        request = pickle.dumps((command, env, cwd, sorted(modules)))
        with self._request:
            if not self.alive:
                raise TemplateGone("the fork template has ended")
            socket.send_fds(self._sock, [request], [out])
            with self._changed:
                self._changed.wait_for(lambda: self._answers or not self.alive)
                if not self._answers:
                    raise TemplateGone("the fork template ended while forking")
                answer = self._answers.pop(0)
        if answer[0] != "started":
            raise TemplateGone(f"the fork template could not fork: {answer[1]}")
        return answer[1]

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            return self._exits.get(pid)

    def wait(self, pid: int, timeout: float | None) -> int:
        with self._changed:
            if not self._changed.wait_for(lambda: pid in self._exits, timeout):
                raise subprocess.TimeoutExpired(f"node process {pid}", timeout or 0.0)
            return self._exits[pid]

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(_MESSAGE_MAX)
            except OSError:
                data = b""
            with self._changed:
                if not data:
                    # Its children die with it (their death signal): what they exited
                    # with is not known; say killed, as Popen would of a SIGKILL.
                    self.alive = False
                    for pid in self._children - set(self._exits):
                        self._exits[pid] = -signal.SIGKILL
                    self._changed.notify_all()
                    return
                message = pickle.loads(data)
                if message[0] == "exited":
                    self._exits[message[1]] = message[2]
                else:
                    if message[0] == "started":
                        self._children.add(message[1])
                    self._answers.append(message)
                self._changed.notify_all()


_template: _Template | None = None


def open_template() -> bool:
    """Import what every node imports and fork the template from this process. Call it
    before this process runs any torch op or starts a thread (``zmqrl up`` does, first
    thing). False (and nothing forked) if forking is off here, or if this process already
    runs other Python threads (a fork would copy the locks they hold, not the threads)."""
    global _template
    if _template is not None:
        return True
    if not enabled() or threading.active_count() > 1:
        return False
    for module in PRELOAD:
        importlib.import_module(module)
    for stream in (sys.stdout, sys.stderr):  # nothing buffered is written twice
        stream.flush()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        ours.close()
        _serve(theirs)  # never returns
    theirs.close()
    _template = _Template(pid, ours)
    return True


def ready() -> bool:
    """Whether this process opened a template to fork nodes from (if it has ended since,
    :func:`start` raises :class:`TemplateGone`, so that the caller says so)."""
    return _template is not None and enabled()


def start(command: list[str], env: dict[str, str], modules: Iterable[str] = ()) -> ForkedNode:
    """Fork what ``command`` (``python -m zmqrl.cli node ...``) would run from the template,
    with ``env`` as its whole environment; ``ps`` shows it as ``command``. ``modules``:
    what the template imports first (the topology's node modules), once."""
    if command[1:3] != ["-m", "zmqrl.cli"]:
        raise ValueError(f"not a zmqrl command: {command[:3]}")
    if _template is None:
        raise TemplateGone("no fork template: open_template() was not called")
    read, write = os.pipe()
    try:
        pid = _template.start(command, env, os.getcwd(), modules, write)
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)  # the child holds its copy: EOF when it (and its children) end
    return ForkedNode(_template, pid, open(read, encoding="utf-8", errors="replace"))  # noqa: SIM115


# ----- the template --------------------------------------------------------------------
def _serve(sock: socket.socket) -> None:
    """The template's loop: fork a child per request, send back each child's exit code;
    end when the supervisor does. It shares the supervisor's process group, so a SIGTERM,
    SIGHUP or SIGINT sent to that group (``kill -- -PGID``, a closed terminal, Ctrl-C)
    must not end it before the supervisor has stopped the nodes: they would get their
    death signal twice."""
    code = 0
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        from zmqrl.bus import lifetime

        lifetime.die_with_parent(signal.SIGKILL)
        if os.getppid() == 1:
            os._exit(0)  # the supervisor died before the line above
        _set_title(f"zmqrl fork template (supervisor {os.getppid()})")
        # The supervisor's other files are not the nodes' business (as Popen's close_fds)
        _close_fds_but(0, 1, 2, sock.fileno())
        # Each child runs zmqrl.cli again as __main__ (what ``python -m`` does) though it
        # was imported here; defining its commands twice is harmless, runpy's warning noise.
        warnings.filterwarnings("ignore", category=RuntimeWarning,
                                message="'zmqrl.cli' found in sys.modules")
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd fires
        with selectors.DefaultSelector() as selector:
            selector.register(sock, selectors.EVENT_READ)
            selector.register(wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fileobj is sock:
                        if not _serve_one(sock, (wake_r, wake_w, selector)):
                            return  # the supervisor is gone; the nodes die with us
                    else:
                        while os.read(wake_r, 512) == 512:
                            pass
                _reap(sock)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the supervisor ended while we told it something: so do we
    except BaseException:
        code = 1
        traceback.print_exc()
    finally:
        os._exit(code)


def _set_title(title: str) -> None:
    import setproctitle

    setproctitle.setproctitle(title)


def _close_fds_but(*keep: int) -> None:
    low = 0
    for fd in sorted(keep):
        if fd > low:  # closerange(n, n) closes every fd from n up (close_range(n, n - 1))
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def _serve_one(sock: socket.socket, ours: tuple) -> bool:
    data, fds, _flags, _addr = socket.recv_fds(sock, _MESSAGE_MAX, 1)
    if not data:
        return False
    command, env, cwd, modules = pickle.loads(data)
    out = fds[0]
    try:
        for module in modules:
            importlib.import_module(module)
        pid = os.fork()
    except BaseException as exc:  # a node module that raises as it is imported
        os.close(out)
        sock.send(pickle.dumps(("failed", f"{type(exc).__name__}: {exc}")))
        return True
    if pid == 0:
        _run_child(command, env, out, cwd, sock, ours)  # never returns
    os.close(out)
    sock.send(pickle.dumps(("started", pid)))
    return True


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(pickle.dumps(("exited", pid, os.waitstatus_to_exitcode(status))))


def _run_child(command: list[str], env: dict[str, str], out: int, cwd: str,
               sock: socket.socket, ours: tuple) -> None:
    """In the forked child: drop the template's own files and handlers, run the command,
    exit with its code."""
    code = 1
    try:
        wake_r, wake_w, selector = ours
        signal.set_wakeup_fd(-1)
        selector.close()
        for fd in (wake_r, wake_w):
            os.close(fd)
        sock.close()
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        code = _child(command, env, out, cwd)
    except BaseException:
        traceback.print_exc()
    finally:
        from zmqrl.bus import lifetime

        lifetime.exit_now(code)  # an interpreter's exit, less its teardown


def _child(command: list[str], env: dict[str, str], out: int, cwd: str) -> int:
    """Become what ``command`` would have been, then run it; its exit code."""
    os.setsid()  # its own session and group: the supervisor signals the whole tree
    _set_title(shlex.join(command))  # ps, top and /proc show the node
    from zmqrl.bus import lifetime
    from zmqrl.bus.node import PARENT_PID_ENV

    lifetime.die_with_parent(signal.SIGTERM)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
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
    try:
        runpy.run_module("zmqrl.cli", run_name="__main__", alter_sys=True)  # python -m
        return 0
    except SystemExit as exc:
        return _exit_code(exc.code)
    except KeyboardInterrupt:
        return 130  # as a shell reports an interrupted command


def _exit_code(value: object) -> int:
    """What an interpreter exits with for ``SystemExit(value)``."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1
