"""tests/machine_share.py: an exclusive test waits for the running ones and runs alone,
and shared tests that arrive while it waits queue behind it rather than starve it.
(flock locks belong to open files, so threads stand in for xdist workers here.)"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from machine_share import hold

from conftest import REPO, wait_for


def turnstile_taken(directory: Path) -> bool:
    fd = os.open(directory / "turnstile.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_an_exclusive_holder_waits_for_shared_ones_and_newcomers_wait_for_it(tmp_path):
    order: list[str] = []
    release_first = threading.Event()

    def shared(name: str, until: threading.Event | None = None) -> None:
        with hold(tmp_path, exclusive=False):
            order.append(f"{name} in")
            if until is not None:
                assert until.wait(10)
            order.append(f"{name} out")

    def exclusive() -> None:
        with hold(tmp_path, exclusive=True):
            order.append("exclusive in")
            order.append("exclusive out")

    first = threading.Thread(target=shared, args=("first", release_first))
    first.start()
    wait_for(lambda: "first in" in order, 5, "the first shared holder")
    writer = threading.Thread(target=exclusive)
    writer.start()
    # once the writer holds the turnstile (and waits for "first"), a newcomer queues
    wait_for(lambda: turnstile_taken(tmp_path), 5, "the exclusive holder at the turnstile")
    late = threading.Thread(target=shared, args=("late",))
    late.start()
    late.join(0.5)
    assert late.is_alive() and order == ["first in"], order  # neither got in
    release_first.set()
    for thread in (first, writer, late):
        thread.join(10)
        assert not thread.is_alive()
    assert order == ["first in", "first out", "exclusive in", "exclusive out",
                     "late in", "late out"], order


def test_shared_holders_run_together(tmp_path):
    both_in = threading.Barrier(2, timeout=5)

    def shared() -> None:
        with hold(tmp_path, exclusive=False):
            both_in.wait()  # raises BrokenBarrierError if the other could not enter

    threads = [threading.Thread(target=shared) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not both_in.broken


INNER_TESTS = '''
import json, os, time
import pytest

def record(name, seconds):
    start = time.monotonic()
    time.sleep(seconds)  # the work a test would do
    with open(os.environ["SPANS"], "a") as f:
        f.write(json.dumps([name, os.environ["PYTEST_XDIST_WORKER"], start,
                            time.monotonic()]) + "\\n")

@pytest.mark.exclusive
@pytest.mark.parametrize("i", range(2))
def test_alone(i):
    record(f"alone{i}", 1.0)

@pytest.mark.parametrize("i", range(12))
def test_shared(i):
    record(f"shared{i}", 0.25)
'''


def test_under_xdist_an_exclusive_test_overlaps_no_other(tmp_path):
    """A real pytest-xdist session of 2 workers with tests/conftest.py as its plugin:
    the two exclusive tests overlap no other test, and the shared ones do overlap each
    other (the lock does not run everything one at a time)."""
    (tmp_path / "test_inner.py").write_text(INNER_TESTS)
    spans = tmp_path / "spans.jsonl"
    env = {**os.environ, "SPANS": str(spans), "PYTHONPATH": str(REPO / "tests")}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
         "-n", "2", "--dist", "load", "-c", os.devnull, "--rootdir", str(tmp_path),
         "--basetemp", str(tmp_path / "inner-tmp"),  # not a numbered dir beside ours
         str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in spans.read_text().splitlines()]
    assert len(rows) == 14 and len({r[1] for r in rows}) >= 2, rows
    alone = [r for r in rows if r[0].startswith("alone")]
    shared = [r for r in rows if r[0].startswith("shared")]
    for name, _, start, end in alone:
        for other, _, s, e in rows:
            if other != name:
                assert e <= start or s >= end, (name, other, rows)
    assert any(a[2] < b[3] and b[2] < a[3] for a in shared for b in shared
               if a[1] != b[1]), shared
