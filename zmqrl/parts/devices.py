"""Where models run, and the one way numpy batches reach them.

``pick_device("auto")`` is CUDA when torch sees a GPU, else the CPU. ``HostToDevice``
moves numpy arrays onto the device:

* on the CPU it is ``torch.from_numpy``: no copy at all;
* on CUDA each array goes through a page-locked (pinned) staging buffer, reused from
  call to call, and is copied with ``non_blocking=True``: the copy is a DMA that the
  GPU runs while the CPU goes on (a pageable array would make the driver stage it
  itself, synchronously). Before a buffer is overwritten, the event recorded after its
  last copy is waited on, so a copy still in flight never sees its source change.

Arrays keep their dtype: uint8 frames cross PCIe as bytes (4x fewer than float32) and
the model converts them on the device.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import numpy as np
import torch

from zmqrl.parts.precision import PRECISIONS, check_precision

__all__ = ["PRECISIONS", "check_precision"]  # re-exported: checked without torch there


def pick_device(name: str, replica: int = 0) -> torch.device:
    """``auto``: CUDA if available, else CPU; anything else as torch names it.

    A CUDA device without an index goes to GPU ``replica % count``: the replicas of a
    node on a host with several GPUs spread over them (NCCL refuses two ranks of one
    group on one GPU)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        count = torch.cuda.device_count()
        if count == 0:
            raise ValueError(f"device '{name}': torch sees no CUDA device")
        device = torch.device("cuda", replica % count)
    return device


def native_bfloat16(device: torch.device) -> bool:
    """Whether ``device`` computes in bfloat16 natively: a CUDA GPU that supports it, or
    a CPU with AVX-512 BF16 or AMX (elsewhere bfloat16 is emulated, slower than float32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private to torch.cpu
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def resolve_precision(precision: str, device: torch.device) -> str:
    """``precision`` as it will run on ``device``: ``auto`` made concrete; a precision
    the device cannot run is a ValueError naming why (float16 on a CPU)."""
    problem = check_precision(precision, device.type)
    if problem:
        raise ValueError(f"precision: {problem}")
    if precision == "auto":
        return "bfloat16" if native_bfloat16(device) else "float32"
    return precision


def autocast(device: torch.device, precision: str) -> Any:
    """The context for a forward pass in ``precision`` on ``device``: torch.autocast
    (matrix products and convolutions in the lower precision, reductions and the
    parameters in float32), or nothing for float32."""
    if precision == "float32":
        return nullcontext()
    problem = check_precision(precision, device.type)
    if problem:
        raise ValueError(f"precision: {problem}")
    return torch.autocast(device.type, dtype=getattr(torch, precision))


class HostToDevice:
    """Callable ``(key, array) -> tensor on device``; one staging buffer per key."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self._staging: dict[str, tuple[torch.Tensor, torch.cuda.Event]] = {}

    def __call__(self, key: str, array: np.ndarray) -> torch.Tensor:
        if not self.cuda:
            # torch refuses read-only memory (frames decoded from a message are): copy.
            return torch.from_numpy(array if array.flags.writeable else array.copy())
        source = torch.from_numpy(np.ascontiguousarray(array))
        staged = self._staging.get(key)
        if (staged is None or staged[0].dtype != source.dtype
                or staged[0].numel() < source.numel()):
            buffer = torch.empty(max(source.numel(), 1), dtype=source.dtype,
                                 pin_memory=True)
            staged = (buffer, torch.cuda.Event())
            staged[1].record()  # nothing in flight yet: a recorded event is complete
            self._staging[key] = staged
        buffer, done = staged
        done.synchronize()  # the last copy out of this buffer has finished
        pinned = buffer[:source.numel()].view(source.shape)
        pinned.copy_(source)
        out = pinned.to(self.device, non_blocking=True)
        done.record()
        return out

    def batch(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return {key: self(key, array) for key, array in arrays.items()}
