"""Declared ranges of config fields: the range of a number sits next to its default.

A config dataclass (an algorithm's ``algo`` section, :mod:`zmqrl.parts.algo_config`, a
plug-in's too) declares a numeric field with :func:`ranged`::

    discount: float = ranged(0.99, ge=0, le=1)
    batch_size: int = ranged(32, ge=1)  # sequences per update
    clip_rho: float | None = ranged(1.0, gt=0)  # None: no clipping (None always passes)

and gets, with nothing else to write: ``zmqrl validate`` naming the field when a value is
out of range (:func:`range_errors`, called for every config class), a config built
directly with a bad value raising, and PBT keeping a perturbed value inside the range
(:meth:`Range.clip`). Values of the wrong type are not this module's to report: the
topology's type check names them.

No torch here, and nothing of zmqrl: every node reads its config through this.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RANGE = "range"  # the key of a field's metadata that holds its Range


def is_number(value: Any) -> bool:
    """An int or float that is not a bool (YAML's true is no number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _show(x: float) -> str:
    return repr(x) if isinstance(x, int) else f"{x:g}"


@dataclass(frozen=True)
class Range:
    """Bounds of a number: ``ge``/``gt`` below, ``le``/``lt`` above (each optional);
    ``why`` is said after the bound when a value breaks it."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    why: str = ""

    def __post_init__(self) -> None:
        if self.ge is not None and self.gt is not None or \
                self.le is not None and self.lt is not None:
            raise ValueError("a range takes one lower bound (ge or gt) and one upper "
                             "(le or lt)")

    def __str__(self) -> str:
        low = f"[{_show(self.ge)}" if self.ge is not None else \
            f"({_show(self.gt)}" if self.gt is not None else None
        high = f"{_show(self.le)}]" if self.le is not None else \
            f"{_show(self.lt)})" if self.lt is not None else None
        if low and high:
            text = f"must be in {low}, {high}"
        elif low:
            text = f"must be {'>=' if self.ge is not None else '>'} {low[1:]}"
        elif high:
            text = f"must be {'<=' if self.le is not None else '<'} {high[:-1]}"
        else:
            text = "must be a finite number"
        return f"{text} ({self.why})" if self.why else text

    def contains(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le)
                and (self.lt is None or value < self.lt))

    def check(self, value: Any) -> str | None:
        """What is wrong with ``value`` (``"0: must be >= 1"``), or None. None and
        values that are not numbers pass: nullable fields accept None, and a wrong type
        is the type check's to report."""
        if not is_number(value) or self.contains(value):
            return None
        return f"{value!r}: {self}"

    def clip(self, value: float) -> float:
        """``value`` moved to the nearest value inside the range, of the same type (an
        int stays an int; an exclusive bound is stepped past: the next int, or the next
        float). NaN is not clipped: it has no nearest value (:meth:`check` refuses it)."""
        integer = isinstance(value, int) and not isinstance(value, bool)
        lower, upper = self._lowest(integer), self._highest(integer)
        if lower is not None and value < lower:
            value = lower
        if upper is not None and value > upper:
            value = upper
        return int(value) if integer else float(value)

    def _lowest(self, integer: bool) -> float | None:
        if self.ge is not None:
            return math.ceil(self.ge) if integer else self.ge
        if self.gt is not None:
            return math.floor(self.gt) + 1 if integer else math.nextafter(self.gt, math.inf)
        return None

    def _highest(self, integer: bool) -> float | None:
        if self.le is not None:
            return math.floor(self.le) if integer else self.le
        if self.lt is not None:
            return math.ceil(self.lt) - 1 if integer else math.nextafter(self.lt, -math.inf)
        return None


def ranged(default: Any, *, ge: float | None = None, gt: float | None = None,
           le: float | None = None, lt: float | None = None, why: str = "") -> Any:
    """A dataclass field with ``default`` and a declared :class:`Range` (its metadata)."""
    bounds = Range(ge=ge, gt=gt, le=le, lt=lt, why=why)
    problem = bounds.check(default)
    if problem:  # a default outside its own range is a bug in the declaration
        raise ValueError(f"default {problem}")
    return dataclasses.field(default=default, metadata={RANGE: bounds})


def ranges(cls: type) -> dict[str, Range]:
    """Field name -> declared Range of a config dataclass (fields without one omitted)."""
    if not dataclasses.is_dataclass(cls):
        return {}
    return {f.name: f.metadata[RANGE] for f in dataclasses.fields(cls) if RANGE in f.metadata}


def range_of(cls: type, name: str) -> Range | None:
    return ranges(cls).get(name)


def range_errors(cls: type, values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, message) for each value of ``values`` (a config section, or a config's
    fields) outside its field's declared range, in field order."""
    return [(name, problem) for name, bounds in ranges(cls).items()
            if name in values and (problem := bounds.check(values[name])) is not None]
