"""Checkpoints: one persistence interface for every node that keeps state.

A node that persists state (learner, replay, parameter server) is, or owns, a
:class:`Saveable`: ``state()`` says *what* to keep, ``restore(state)`` takes it back. A
:class:`Checkpointer` decides *when* and *where*: ``maybe_save(count)`` every N of the
node's own counter (updates, versions) and/or every S seconds, ``save()`` at exit or when
asked, ``restore_if_present()`` at start. One file per node,
``checkpoints/<label><suffix>`` in the run directory (:func:`node_checkpoint`), in one of
three formats: :data:`TORCH` (``torch.save``, loaded with ``weights_only=True``, for
tensors and optimizer state), :data:`NPZ` (an uncompressed ``np.savez`` of flat
arrays, no pickles, for big buffers) or :data:`JSON` (a controller's plain state: PBT's,
the population league's). The shape follows Acme's CheckpointingRunner.

Every write goes through :func:`atomic_write`, so the file at the final path is always a
complete checkpoint, the previous one or the new one, even if the process is killed (or
the machine loses power) in the middle of a write.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, runtime_checkable

import numpy as np

CHECKPOINT_DIR = "checkpoints"
_TMP_SUFFIX = ".tmp"


@runtime_checkable
class Saveable(Protocol):
    """What a checkpoint holds: ``state()`` must return what the :class:`Format` can
    write (TORCH: tensors, numbers, strings, lists and dicts of them; NPZ: a flat dict
    of arrays and scalars); ``restore`` gets back what ``state()`` returned (NPZ: as
    arrays, scalars as 0-d arrays) and raises KeyError/ValueError for a state it cannot
    take."""

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Format:
    """How a state dict becomes bytes and back."""

    suffix: str
    dump: Callable[[dict[str, Any], BinaryIO], None]
    load: Callable[[Path], dict[str, Any]]


def _torch_dump(state: dict[str, Any], f: BinaryIO) -> None:
    import torch  # here, so nodes that only write NPZ do not pay for importing torch

    torch.save(state, f)


def _torch_load(path: Path) -> dict[str, Any]:
    import torch

    # Plain tensors and containers only: loading runs no pickled code. On the CPU:
    # RNG states must stay there, and load_state_dict moves the rest where it belongs.
    return torch.load(path, map_location="cpu", weights_only=True)


def _npz_dump(state: dict[str, Any], f: BinaryIO) -> None:
    np.savez(f, **state)  # uncompressed: big buffers save at disk speed


def _npz_load(path: Path) -> dict[str, Any]:
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def _json_dump(state: dict[str, Any], f: BinaryIO) -> None:
    f.write(json.dumps(state).encode())


TORCH = Format(".pt", _torch_dump, _torch_load)
NPZ = Format(".npz", _npz_dump, _npz_load)
JSON = Format(".json", _json_dump, lambda path: json.loads(Path(path).read_text()))


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def node_checkpoint(run_dir: str | Path, label: str, suffix: str) -> Path:
    """Where the node ``label`` keeps its checkpoint (``suffix`` includes the format's
    extension, e.g. ``.pt`` or ``.replay.npz``)."""
    return checkpoint_dir(run_dir) / f"{label}{suffix}"


class Checkpointer:
    """Saves ``saveable`` to ``path`` by one policy: every ``every`` counts (see
    :meth:`maybe_save`; 0: never by count), every ``every_s`` seconds (0: never by time;
    counted from the *end* of the last save, so a state that takes about as long to save
    as the period still leaves the node time to serve), and whenever :meth:`save` is
    called (at exit). ``last_save_s`` says how long the last save took."""

    def __init__(self, path: str | Path, saveable: Saveable, every: int = 0,
                 every_s: float = 0.0, format: Format = TORCH,
                 log: logging.Logger | None = None) -> None:
        if every < 0 or every_s < 0:
            raise ValueError(f"every and every_s must be >= 0, got {every}, {every_s}")
        self.path = Path(path)
        self.saveable = saveable
        self.every = int(every)
        self.every_s = float(every_s)
        self.format = format
        self.log = log or logging.getLogger(__name__)
        self.saves = 0
        self.last_save_s = 0.0  # how long the last save took
        self._saved_at = time.monotonic()  # when the last save (or the start) ended
        self._saved_count: int | None = None

    def due(self, count: int | None = None) -> bool:
        """Would :meth:`maybe_save` save now?"""
        if self.every and count is not None and count % self.every == 0 \
                and count != self._saved_count:
            return True
        return bool(self.every_s) and time.monotonic() - self._saved_at >= self.every_s

    def maybe_save(self, count: int | None = None) -> bool:
        """Save if the policy says so: ``count`` (the node's own counter, e.g. updates)
        is a multiple of ``every`` not saved yet, or ``every_s`` passed since the last
        save. Cheap when nothing is due, so it can run every loop turn. True if saved."""
        if not self.due(count):
            return False
        self.save(count)
        return True

    def save(self, count: int | None = None) -> float:
        """Write the saveable's state now, crash-safely; returns the seconds it took."""
        t0 = time.monotonic()
        state = self.saveable.state()
        atomic_write(self.path, lambda f: self.format.dump(state, f))
        self._saved_at = time.monotonic()
        self._saved_count = count
        self.last_save_s = self._saved_at - t0
        self.saves += 1
        return self.last_save_s

    def restore_if_present(self) -> bool:
        """Restore the saveable from ``path`` if there is a checkpoint; False if none.

        A checkpoint that cannot be read or restored raises RuntimeError naming the
        file, rather than silently starting afresh: it may be all a run has."""
        if not self.path.exists():
            return False
        try:
            state = self.format.load(self.path)
            self.saveable.restore(state)
        except Exception as exc:  # noqa: BLE001 - any failure: say which file, then stop
            raise RuntimeError(f"cannot restore {self.path}: {type(exc).__name__}: {exc}; "
                               "move it away to start afresh") from exc
        self._saved_at = time.monotonic()
        return True


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
