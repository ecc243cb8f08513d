"""The arithmetic a forward pass may run in (a node's ``precision`` argument), checked
without torch: a topology is validated wherever it loads (``zmqrl up``, every node), and
importing torch there would cost each of those processes seconds of CPU.
:mod:`zmqrl.parts.devices` makes ``auto`` concrete on a device."""

from __future__ import annotations

# ``auto`` is bfloat16 where the hardware computes it natively, else float32
# (zmqrl.parts.devices.resolve_precision).
PRECISIONS = ("auto", "float32", "bfloat16", "float16")


def check_precision(precision: str, device: str = "auto") -> str | None:
    """Why ``precision`` cannot run on ``device`` (a node's ``device`` arg), or None."""
    if precision not in PRECISIONS:
        return f"'{precision}' is not one of {', '.join(PRECISIONS)}"
    if precision == "float16" and device.startswith("cpu"):
        return "float16 runs on CUDA only (on a CPU use bfloat16)"
    return None
