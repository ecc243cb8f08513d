"""Carry an optimizer's per-parameter state (Adam's moments) through a surgery.

A fresh Adam after a surgery would take its first steps at full size in every
direction (its bias correction makes step 1 ``lr * sign(g)``): a jolt to the carried
function that the carry itself took care to avoid. So the moments follow the
parameters: where :func:`~zmqrl.parts.surgery.net2net.carry` placed an old parameter's
values unchanged in a new one (``Report.placed``: copied, or the top-left block of a
wider one), the old moments go to the same place and the new entries start at 0, as a
fresh Adam's do; a parameter scaled or made anew starts afresh. Both of zmqrl's Adams
are carried: ``torch.optim`` optimizers (state per parameter) and
:class:`~zmqrl.parts.algos.optim.LightAdam` (moment lists and one step count); any other
optimizer is left fresh, and said so.
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
        new_opt.step_count = old_opt.step_count
        for i, param in enumerate(new_opt.params):
            total += 1
            found = source(param)
            if found is None or id(found[0]) not in index:
                continue  # fresh: zero moments (as a new unit's)
            j = index[id(found[0])]
            new_opt.exp_avg[i] = moved(old_opt.exp_avg[j], param, found[1])
            new_opt.exp_avg_sq[i] = moved(old_opt.exp_avg_sq[j], param, found[1])
            carried += 1
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
                new_opt.state[param] = {
                    key: moved(value, param, where)
                    if torch.is_tensor(value) and value.shape == old_param.shape
                    else (value.clone() if torch.is_tensor(value) else value)
                    for key, value in state.items()}
                carried += 1
        return carried, total
    return 0, sum(len(g["params"]) for g in new_opt.param_groups)
