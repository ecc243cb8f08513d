"""Checkpoint files: crash-safe writes, and where a run directory keeps them.

Every node that persists state (the learner's ``checkpoints/<label>.pt``, the replay's
``checkpoints/<label>.replay.npz``) writes through :func:`atomic_write`, so the file at
the final path is always a complete checkpoint, the previous one or the new one, even if
the process is killed (or the machine loses power) in the middle of a write.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

CHECKPOINT_DIR = "checkpoints"
_TMP_SUFFIX = ".tmp"


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write ``path`` with ``write(file)``: into a temporary file beside it, fsync, then
    rename over ``path`` and fsync the directory.

    A rename within one filesystem is atomic, so readers (and a restarted node) see the
    old file or the new one, never a torn one; the fsyncs make that hold across a power
    loss too, not only a killed process. A kill mid-write leaves ``<name>.tmp`` behind,
    which the next write replaces and :func:`existing_checkpoints` ignores.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + _TMP_SUFFIX)
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself is durable only once the directory is
    finally:
        os.close(fd)


def existing_checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete checkpoint files of a run directory (leftover temp files excluded)."""
    directory = checkpoint_dir(run_dir)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir()
                  if p.is_file() and not p.name.endswith(_TMP_SUFFIX))
