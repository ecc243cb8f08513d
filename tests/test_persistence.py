"""The persistence interface (zmqrl/parts/checkpoint.py): one policy for when to save, two
formats, and restores that either take the whole state or say which file they refused."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from zmqrl.parts.checkpoint import NPZ, TORCH, Checkpointer, Saveable, node_checkpoint

from conftest import wait_for


class Counter:
    """A Saveable with a tensor, an array and a number."""

    def __init__(self) -> None:
        self.n = 0
        self.weights = torch.zeros(3)
        self.buffer = np.zeros(4, np.int64)

    def state(self) -> dict[str, Any]:
        return {"n": self.n, "weights": self.weights.clone(),
                "buffer": torch.from_numpy(self.buffer.copy())}  # torch: no numpy arrays

    def restore(self, state: dict[str, Any]) -> None:
        self.n = int(state["n"])
        self.weights = torch.as_tensor(state["weights"])
        self.buffer = np.asarray(state["buffer"])


def test_saves_every_n_of_the_counter_once_each_and_at_exit(tmp_path: Path) -> None:
    thing = Counter()
    assert isinstance(thing, Saveable)
    ckpt = Checkpointer(node_checkpoint(tmp_path, "ps", ".pt"), thing, every=3)
    saved_at = []
    for count in range(1, 11):
        thing.n = count
        if ckpt.maybe_save(count):
            saved_at.append(count)
        assert not ckpt.maybe_save(count)  # the same count is not saved twice
    assert saved_at == [3, 6, 9] and ckpt.saves == 3
    assert torch.load(ckpt.path, weights_only=True)["n"] == 9
    thing.n = 10
    ckpt.save()  # at exit
    assert torch.load(ckpt.path, weights_only=True)["n"] == 10
    assert ckpt.path == tmp_path / "checkpoints" / "ps.pt"
    assert not list(ckpt.path.parent.glob("*.tmp"))


def test_saves_every_s_seconds_counted_from_the_end_of_the_last_save(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path / "c.npz", Counter(), every_s=0.3, format=NPZ)
    assert not ckpt.maybe_save()  # not before the first period has passed
    t0 = time.monotonic()
    wait_for(ckpt.maybe_save, 5, "a timed save")
    assert time.monotonic() - t0 >= 0.25 and ckpt.path.exists()
    assert not ckpt.maybe_save()
    assert not Checkpointer(tmp_path / "d.pt", Counter()).maybe_save(10)  # no policy: never


@pytest.mark.parametrize("fmt", [TORCH, NPZ], ids=["torch", "npz"])
def test_restore_round_trip(tmp_path: Path, fmt) -> None:
    path = tmp_path / f"thing{fmt.suffix}"
    fresh = Counter()
    assert not Checkpointer(path, fresh, format=fmt).restore_if_present()
    assert fresh.n == 0
    thing = Counter()
    thing.n, thing.weights, thing.buffer = 7, torch.arange(3.0), np.arange(4)
    Checkpointer(path, thing, format=fmt).save()
    assert Checkpointer(path, fresh, format=fmt).restore_if_present()
    assert fresh.n == 7 and torch.equal(fresh.weights, torch.arange(3.0))
    assert np.array_equal(fresh.buffer, np.arange(4))


def test_an_unreadable_or_unfitting_checkpoint_is_refused_naming_the_file(tmp_path) -> None:
    path = tmp_path / "bad.pt"
    path.write_bytes(b"not a checkpoint")
    refused = f"(?s)cannot restore {re.escape(str(path))}.*move it away"
    with pytest.raises(RuntimeError, match=refused):
        Checkpointer(path, Counter()).restore_if_present()
    torch.save({"something": 1}, path)  # readable, but not this saveable's state
    with pytest.raises(RuntimeError, match="KeyError"):
        Checkpointer(path, Counter()).restore_if_present()
