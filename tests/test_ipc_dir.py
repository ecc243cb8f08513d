"""The directory of a run's ipc socket files is this user's alone (no CURVE on ipc).

A run directory whose path is too long for a Unix socket gets its sockets in
``<tmp>/zmqrl-<sha1 of the run directory>`` (protocol.md §2): a name any local user can
compute and create first. These tests plant what such a user could (a symbolic link,
a directory open to all, a directory of another owner) and require a clear refusal;
and they check that the directory is 0700 under any umask, for a real ``zmqrl node``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from zmqrl.bus.endpoints import UnsafeDirectoryError, ipc_dir

from conftest import stop_all, wait_for, write_topology


@pytest.fixture
def short_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private stand-in for /tmp, short enough for socket paths, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="zq"))
    monkeypatch.setattr(tempfile, "tempdir", str(path))  # what gettempdir() returns
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def umask_0() -> Iterator[None]:
    old = os.umask(0)
    yield
    os.umask(old)


def deep_run_dir(tmp_path: Path) -> Path:
    return tmp_path / ("d" * 60) / "run"


def fallback_of(run_dir: Path, tmp: Path) -> Path:
    """The documented fallback name (protocol.md §2), computed independently."""
    digest = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:12]
    return tmp / f"zmqrl-{digest}"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_fallback_dir_is_created_private_whatever_the_umask(tmp_path, short_tmp, umask_0):
    run_dir = deep_run_dir(tmp_path)
    made = ipc_dir(run_dir)
    assert made == fallback_of(run_dir, short_tmp)
    assert mode(made) == 0o700 and made.stat().st_uid == os.geteuid()
    assert ipc_dir(run_dir) == made  # the next process of the run accepts it


def test_run_dir_ipc_is_private_whatever_the_umask(short_tmp, umask_0):
    made = ipc_dir(short_tmp / "run")  # short: no fallback
    assert made == (short_tmp / "run" / "ipc").resolve() and mode(made) == 0o700
    # A run made before this check (umask 0: 0777) is tightened when resumed.
    older = short_tmp / "older"
    (older / "ipc").mkdir(parents=True, mode=0o777)
    assert mode(older / "ipc") == 0o777
    assert mode(ipc_dir(older)) == 0o700


def test_fallback_dir_planted_as_a_symlink_is_refused(tmp_path, short_tmp):
    run_dir = deep_run_dir(tmp_path)
    attacker = short_tmp / "attacker"
    attacker.mkdir()
    os.chmod(attacker, 0o777)  # a directory anyone may use, as /tmp itself
    fallback_of(run_dir, short_tmp).symlink_to(attacker)
    with pytest.raises(UnsafeDirectoryError, match="is a symbolic link"):
        ipc_dir(run_dir)
    assert mode(attacker) == 0o777  # not even chmod'ed through the link
    (short_tmp / "run").mkdir()
    (short_tmp / "run" / "ipc").symlink_to(attacker)  # the same inside a run directory
    with pytest.raises(UnsafeDirectoryError, match="is a symbolic link"):
        ipc_dir(short_tmp / "run")


def test_fallback_dir_open_to_others_or_not_a_directory_is_refused(tmp_path, short_tmp):
    run_dir = deep_run_dir(tmp_path)
    fallback = fallback_of(run_dir, short_tmp)
    fallback.mkdir()
    os.chmod(fallback, 0o777)  # made first, writable by all: may hold planted sockets
    with pytest.raises(UnsafeDirectoryError, match="mode 0777 lets other users write"):
        ipc_dir(run_dir)
    assert mode(fallback) == 0o777  # refused, not repaired
    os.chmod(fallback, 0o755)  # ours, readable but not writable by others: tightened
    assert ipc_dir(run_dir) == fallback and mode(fallback) == 0o700
    fallback.rmdir()
    fallback.write_text("")
    with pytest.raises(UnsafeDirectoryError, match="not a directory"):
        ipc_dir(run_dir)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory of another user needs root")
def test_fallback_dir_of_another_user_is_refused(tmp_path, short_tmp):
    run_dir = deep_run_dir(tmp_path)
    fallback = fallback_of(run_dir, short_tmp)
    fallback.mkdir(mode=0o700)
    os.chown(fallback, 65534, 65534)  # nobody: the local user who got there first
    with pytest.raises(UnsafeDirectoryError, match="belongs to uid 65534"):
        ipc_dir(run_dir)


def test_node_refuses_a_planted_fallback_dir_and_binds_nothing_there(tmp_path, short_tmp,
                                                                    processes):
    """End to end: a real ``zmqrl node`` whose socket directory another user planted
    exits with the reason instead of binding its ports in that user's directory."""
    run_dir = deep_run_dir(tmp_path)
    attacker = short_tmp / "attacker"
    attacker.mkdir()
    os.chmod(attacker, 0o777)  # a directory anyone may use, as /tmp itself
    fallback_of(run_dir, short_tmp).symlink_to(attacker)
    topo = write_topology(tmp_path)
    log = tmp_path / "learner.log"
    proc = processes.start([sys.executable, "-m", "zmqrl.cli", "node", str(topo), "learner",
                            "--run-dir", str(run_dir)], log=log, env={"TMPDIR": str(short_tmp)})
    wait_for(lambda: proc.poll() is not None or any(attacker.iterdir()), 120,
             "the node to exit or to bind")
    assert list(attacker.iterdir()) == [], "the node bound its ports in the planted dir"
    assert proc.returncode != 0
    assert "refusing socket directory" in log.read_text()


def test_node_under_umask_0_keeps_its_sockets_private(tmp_path, processes):
    run_dir = Path(tempfile.mkdtemp(prefix="zq"))  # short: the sockets stay in run/ipc
    try:
        topo = write_topology(tmp_path)
        processes.start(["sh", "-c", 'umask 0 && exec "$@"', "sh", sys.executable, "-m",
                         "zmqrl.cli", "node", str(topo), "learner", "--run-dir", str(run_dir)],
                        log=tmp_path / "learner.log")
        sock = run_dir / "ipc" / "learner-0-params"
        wait_for(sock.exists, 120, f"the learner to bind {sock}")
        assert mode(run_dir / "ipc") == 0o700
    finally:
        stop_all(processes.procs)
        shutil.rmtree(run_dir, ignore_errors=True)
