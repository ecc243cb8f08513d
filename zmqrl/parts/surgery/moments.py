"""Carry an optimizer's per-parameter state (Adam's moments) through a surgery.

A fresh Adam after a surgery would take its first steps at full size in every
direction (its bias correction makes step 1 ``lr * sign(g)``): a jolt to the carried
function that the carry itself took care to avoid. So the moments follow the
parameters: where :func:`~zmqrl.parts.surgery.net2net.carry` placed an old parameter's
values unchanged in a new one (``Report.placed``: copied, or the top-left block of a
wider one), the old moments go to the same place and the new entries start at 0, as a
fresh Adam's do; a parameter scaled or made anew starts afresh.

**The step count restarts where anything is fresh.** Adam divides its moments by
``1 - beta^t``; zero moments under an old ``t`` (no correction left) step by
``m / sqrt(v)``, which for a steady gradient is ~3x the lr at the first step and ~6x by
the tenth (v warms up a hundred times slower than m): measured, that took a carried
CartPole policy's entropy from 0.25 to 0.002 in 11 updates. Restarted, the fresh
entries take a new Adam's bias-corrected steps (the first is ``lr * sign(g)``) and the
carried ones steps at most their old size (the correction damps them: 0.3x at step 1,
0.8x by step 1,000). A parameter copied whole keeps its own count (``torch.optim``
counts per parameter); :class:`~zmqrl.parts.algos.optim.LightAdam`, one count for all,
restarts it whenever any parameter is not copied whole. Any other optimizer is left
fresh, and said so. (Tried instead: the old count kept, fresh entries' second moment
started at the mean of the carried ones: masked CartPole carried into full CartPole
reached 475 no sooner, 274 and 166 updates against 274 and 132.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from zmqrl.parts.algos.optim import LightAdam


def optimizers(algo: Any) -> dict[str, Any]:
    """The optimizers an algorithm object holds, by attribute name."""
    return {name: value for name, value in vars(algo).items()
            if isinstance(value, torch.optim.Optimizer | LightAdam)}


def carry_moments(old_opt: Any, new_opt: Any, old_model: nn.Module, new_model: nn.Module,
                  placed: dict[str, tuple[str, tuple]]) -> tuple[int, int]:
    """Write ``old_opt``'s per-parameter state into ``new_opt`` (in place) where the
    parameter was placed unchanged. Returns (parameters carried, parameters in total)."""
    old_names = {id(p): n for n, p in old_model.named_parameters()}
    old_by_name = dict(old_model.named_parameters())
    new_names = {id(p): n for n, p in new_model.named_parameters()}

    def source(param: torch.Tensor) -> tuple[torch.Tensor, tuple] | None:
        name = new_names.get(id(param))
        if name is None or name not in placed:
            return None
        old_name, where = placed[name]
        return old_by_name[old_name], where

    def moved(old: torch.Tensor, shape_of: torch.Tensor, where: tuple) -> torch.Tensor:
        out = torch.zeros_like(shape_of)
        out[where] = old.to(out.dtype)
        return out

    carried = total = 0
    if isinstance(old_opt, LightAdam) and isinstance(new_opt, LightAdam):
        index = {id(p): i for i, p in enumerate(old_opt.params)}
        whole = True  # every parameter copied whole: the old count stands
        for i, param in enumerate(new_opt.params):
            total += 1
            found = source(param)
            if found is None or id(found[0]) not in index:
                whole = False
                continue  # fresh: zero moments (as a new unit's)
            j = index[id(found[0])]
            new_opt.exp_avg[i] = moved(old_opt.exp_avg[j], param, found[1])
            new_opt.exp_avg_sq[i] = moved(old_opt.exp_avg_sq[j], param, found[1])
            whole = whole and param.shape == found[0].shape
            carried += 1
        new_opt.step_count = old_opt.step_count if whole else 0
        return carried, total
    if isinstance(old_opt, torch.optim.Optimizer) and isinstance(new_opt, torch.optim.Optimizer):
        for group in new_opt.param_groups:
            for param in group["params"]:
                total += 1
                found = source(param)
                state = old_opt.state.get(found[0]) if found is not None else None
                if not state or id(found[0]) not in old_names:
                    continue
                old_param, where = found
                grown = param.shape != old_param.shape
                new_opt.state[param] = {
                    key: moved(value, param, where)
                    if torch.is_tensor(value) and value.shape == old_param.shape
                    # a grown parameter's fresh entries: a new count (module docstring)
                    else torch.zeros_like(value) if key == "step" and grown
                    else (value.clone() if torch.is_tensor(value) else value)
                    for key, value in state.items()}
                carried += 1
        return carried, total
    return 0, sum(len(g["params"]) for g in new_opt.param_groups)
