"""Who has the machine: a learning run held to a wall-clock bound gets it alone.

On a 2-core machine a learning run that must reach a return within N seconds measures
the machine as much as the agent when another test runs beside it (CI's Pendulum runs
took 200 s at a quarter of a quiet machine's env steps a second). Tests marked
``exclusive`` take this lock exclusively, every other test takes it shared, across all
pytest-xdist workers of one run: an exclusive test waits for the tests running on the
other workers to finish, and they start no new test until it is done.

A readers-writer lock of two ``flock`` files, fair to the writer: a shared holder passes
the turnstile (taken exclusively, released at once) before it takes the lock shared; an
exclusive holder keeps the turnstile while it waits, so new shared holders queue behind
it instead of starving it (flock alone lets shared locks overtake a waiting exclusive).
The kernel drops a dead worker's locks with its file descriptors: nothing to clean up.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def hold(directory: Path, exclusive: bool) -> Iterator[None]:
    """The machine, shared or alone, while the ``with`` body runs."""
    directory.mkdir(parents=True, exist_ok=True)
    turnstile = os.open(directory / "turnstile.lock", os.O_RDWR | os.O_CREAT, 0o600)
    machine = os.open(directory / "machine.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if exclusive:
            fcntl.flock(machine, fcntl.LOCK_EX)  # the turnstile held: no one new enters
        else:
            fcntl.flock(machine, fcntl.LOCK_SH)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield
    finally:
        os.close(machine)  # closing drops the locks
        os.close(turnstile)
