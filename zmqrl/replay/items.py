"""What a replay accepts as items: the fields, dtypes, shapes and value rules of
``insert`` messages for the run's algorithm. No sockets.

A replay stores what producers send and serves it to learners again and again (and
into its checkpoints), so one bad value, an action outside the action space, a NaN, a
discount above 1, would crash or poison every learner that samples it. The replay
therefore checks each insert before storing it:

* ``transitions`` (``dqn``): ``obs``/``next_obs`` [B, *obs] obs dtype, finite;
  ``action`` [B, *action] inside the action space; ``reward`` float32 [B] finite;
  ``discount`` float32 [B] in [0, 1];
* ``sequences`` (``r2d2``, L = ``algo.sequence_length``): ``obs`` [B, L+1, *obs];
  ``action`` [B, L, *action]; ``reward`` float32 [B, L] finite; ``done`` bool [B, L];
  ``state_h``/``state_c`` float32 [B, H] finite;
* optional ``priority`` float32 [B], finite and >= 0; no other arrays.

The same rules are declared in ``zmqrl.messages`` (``insert``/``transitions`` and
``insert``/``sequences``); this module is the replay's own copy until the node checks
against those declarations (one call: ``messages.check(msg, spec, ctx)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["ItemRules"]

# name -> (dtype: numpy name, "obs" or "action"; shape pattern; rule)
_Pattern = tuple[str | int, ...]
_TRANSITIONS: dict[str, tuple[str, _Pattern, str | None]] = {
    "obs": ("obs", ("B", "*obs"), "finite"),
    "action": ("action", ("B", "*action"), "action"),
    "reward": ("float32", ("B",), "finite"),
    "discount": ("float32", ("B",), "unit"),
    "next_obs": ("obs", ("B", "*obs"), "finite"),
}
_SEQUENCES: dict[str, tuple[str, _Pattern, str | None]] = {
    "obs": ("obs", ("B", "L+1", "*obs"), "finite"),
    "action": ("action", ("B", "L", "*action"), "action"),
    "reward": ("float32", ("B", "L"), "finite"),
    "done": ("bool", ("B", "L"), None),
    "state_h": ("float32", ("B", "H"), "finite"),
    "state_c": ("float32", ("B", "H"), "finite"),
}
_PRIORITY = ("float32", ("B",), "nonneg")
_RULE_TEXT = {"finite": "finite (no NaN or inf)", "unit": "in [0, 1]",
              "nonneg": "finite and >= 0", "action": "inside the action space"}


@dataclass(frozen=True)
class ItemRules:
    """The insert rules of one replay (see the module docstring)."""

    variant: str  # "transitions" | "sequences"
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    action_shape: tuple[int, ...]
    action_dtype: np.dtype
    num_actions: int | None  # discrete: actions are ints in [0, num_actions)
    sequence_length: int | None = None

    def check(self, arrays: Mapping[str, np.ndarray]) -> int:
        """Raise ValueError naming the array and the rule it breaks; return B."""
        fields = _SEQUENCES if self.variant == "sequences" else _TRANSITIONS
        extra = sorted(arrays.keys() - fields.keys() - {"priority"})
        missing = [k for k in fields if k not in arrays]
        if extra or missing:
            raise ValueError(f"{self.variant} take exactly {', '.join(fields)} (and optional "
                             f"priority): " + "; ".join(
                                 ([f"missing {', '.join(missing)}"] if missing else [])
                                 + ([f"unexpected {', '.join(extra)}"] if extra else [])))
        bound: dict[str, int] = {}
        if self.sequence_length is not None:
            bound["L"] = self.sequence_length
        checks = list(fields.items())
        if "priority" in arrays:
            checks.append(("priority", _PRIORITY))
        for name, (dtype, pattern, rule) in checks:
            arr = arrays[name]
            want = self._dtype(dtype)
            if arr.dtype != want:
                raise ValueError(f"'{name}' must be {want}, got {arr.dtype}")
            if not self._shape_ok(arr.shape, pattern, bound):
                raise ValueError(f"'{name}' must have shape {self._text(pattern, bound)}, "
                                 f"got {list(arr.shape)}")
            if rule is not None and arr.size and not self._rule_ok(rule, arr):
                raise ValueError(f"'{name}' must be {_RULE_TEXT[rule]}")
        return bound["B"]

    def _dtype(self, name: str) -> np.dtype:
        if name == "obs":
            return self.obs_dtype
        if name == "action":
            return self.action_dtype
        return np.dtype(name)

    def _expand(self, pattern: _Pattern) -> list[str | int]:
        out: list[str | int] = []
        for part in pattern:
            if part == "*obs":
                out.extend(self.obs_shape)
            elif part == "*action":
                out.extend(self.action_shape)
            else:
                out.append(part)
        return out

    def _shape_ok(self, shape: tuple[int, ...], pattern: _Pattern,
                  bound: dict[str, int]) -> bool:
        dims = self._expand(pattern)
        if len(shape) != len(dims):
            return False
        new: dict[str, int] = {}
        for size, dim in zip(shape, dims, strict=True):
            if isinstance(dim, int):
                if size != dim:
                    return False
                continue
            sym, _, off = dim.partition("+")
            have = bound.get(sym, new.get(sym))
            if have is None:
                if size - int(off or 0) < 1:
                    return False
                new[sym] = size - int(off or 0)
            elif size != have + int(off or 0):
                return False
        bound.update(new)
        return True

    def _text(self, pattern: _Pattern, bound: dict[str, int]) -> str:
        parts = []
        for dim in self._expand(pattern):
            sym, _, off = str(dim).partition("+")
            parts.append(str(bound[sym] + int(off or 0)) if sym in bound else str(dim))
        return "[" + ", ".join(parts) + "]"

    def _rule_ok(self, rule: str, arr: np.ndarray) -> bool:
        if rule == "finite":
            return arr.dtype.kind != "f" or bool(np.isfinite(arr).all())
        if rule == "unit":
            return bool(((arr >= 0) & (arr <= 1)).all())  # NaN fails both
        if rule == "nonneg":
            return bool(((arr >= 0) & (arr < np.inf)).all())
        # action: discrete ints in [0, num_actions); Box actions finite floats (the
        # policy's own sample, which may lie outside the bounds; the env clips it)
        if self.num_actions is None:
            return bool(np.isfinite(arr).all())
        return bool(((arr >= 0) & (arr < self.num_actions)).all())
