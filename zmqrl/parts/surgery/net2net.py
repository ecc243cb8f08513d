"""Function-preserving transforms of trained parameters into a changed network.

OpenAI Five changed its model and observations about twenty times in ten months and
kept training: each time the trained parameters were carried into the new architecture
so that the new network computed the same function (Berner et al. 2019, §3.3, App. B;
Net2Net, Chen et al. 2016). This module does that for networks made of chains of
``nn.Linear`` layers (every built-in MLP model): a model names its chains
(:class:`Chain`, by ``surgery_chains()``) and :func:`carry` writes the old parameters
into the new model:

* **wider** hidden layers: the old units keep their weights; a new unit keeps its fresh
  initialisation, and its *outgoing* weights are zero, so nothing downstream sees it
  (it still learns: its activation is not zero, so neither is its outgoing gradient);
* **new input features**: their columns are zero in the first layer, for the old units
  (``inputs``: the new column of each old one; by default the old features come first);
* **deeper**: a new hidden layer is inserted before the output layer as the identity on
  the old units: exactly for ReLU (relu(relu(x)) = relu(x)); for tanh, which no layer
  can pass through unchanged, as ``eps`` × I with the next layer's weights ÷ ``eps``
  (tanh is linear near 0: each unit moves by at most eps² / 3, its input being a tanh's),
  and :func:`check` says by how much (exact to 1e-5 at the default eps, 1e-3; but see
  :class:`Net2Net` on training after it);
* **new actions**: a new logit row is the old rows' mean less ``log(1 / logit_tolerance)``,
  so no new action gets more than ``logit_tolerance`` of the probability in any state
  and the old actions' probabilities move by at most that much; a new advantage row
  (dueling Q) is the old rows' mean, which keeps every old Q-value exactly
  (Q = V + A − mean A);
* anything else — fewer layers or units, fewer inputs or outputs, a chain that is not
  there any more, another activation — is refused naming the layer and why, before
  anything is written.

What is carried, transformed or new is in the :class:`Report`; :func:`check` measures
the largest output difference on given observations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

OUTPUTS = ("logits", "value", "advantage", "features")
ACTIVATIONS = {nn.Tanh: "tanh", nn.ReLU: "relu"}


class SurgeryRefused(ValueError):
    """A part of the old model cannot be carried into the new one (names the layer)."""


@dataclass(frozen=True)
class Chain:
    """Linear layers applied one after another (module paths within the model), each but
    the last followed by ``activation``; the last one's outputs are ``output``: logits (a
    new one: a new action), a value, a dueling advantage, or features (no new ones).
    ``reads``: ``"obs"``, or the name of what feeds the first layer otherwise (a
    recurrent model's heads read its LSTM core: ``"core"``)."""

    layers: tuple[str, ...]
    output: str
    activation: str
    # what the first layer reads: "obs" (new observation features become its new
    # columns), or an inner output of the model (an LSTM's: its width must not change)
    reads: str = "obs"


@dataclass
class Report:
    """What :func:`carry` did, parameter by parameter of the new model."""

    copied: list[str] = field(default_factory=list)  # same shape, same values
    transformed: dict[str, str] = field(default_factory=dict)  # name -> how
    fresh: list[str] = field(default_factory=list)  # nothing old to carry: new init kept
    # new parameter -> (old parameter, where its values went unchanged in the new one):
    # what an optimizer's moments follow (zmqrl.parts.surgery.moments); a parameter
    # scaled or made anew has none
    placed: dict[str, tuple[str, tuple]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        return ([f"copied       {n}" for n in self.copied]
                + [f"transformed  {n}: {how}" for n, how in self.transformed.items()]
                + [f"new          {n}" for n in self.fresh])


def chains_of(model: nn.Module) -> list[Chain]:
    """The model's chains: its ``surgery_chains()``; a model without it cannot be carried."""
    declare = getattr(model, "surgery_chains", None)
    if declare is None:
        raise SurgeryRefused(f"{type(model).__name__} does not say how its parameters may "
                             "be carried (no surgery_chains(); give the model's own "
                             "surgery part, docs/surgery.md)")
    return list(declare())


def carry(old: nn.Module, new: nn.Module, inputs: Sequence[int] | None = None,
          logit_tolerance: float = 1e-4, eps: float = 1e-3) -> Report:
    """Write ``old``'s parameters into ``new`` (in place) so that ``new`` computes what
    ``old`` did (module docstring). ``inputs``: the new observation's column of each old
    one (default: the first ones). Raises :class:`SurgeryRefused` before writing anything
    if a layer cannot be carried."""
    old_chains = {c.layers[-1]: c for c in chains_of(old)}
    new_chains = chains_of(new)
    old_params = dict(old.named_parameters())
    plan: dict[str, torch.Tensor] = {}
    report = Report()
    done: set[str] = set()  # (shared layers: a dueling torso feeds two heads)
    for chain in new_chains:
        old_chain = _match(chain, old_chains)
        _carry_chain(old, new, old_chain, chain, inputs, logit_tolerance, eps, plan, report,
                     done)
    new_params = dict(new.named_parameters())
    for name in [n for n in new_params if n not in plan]:  # in no chain: carried as it is
        if name in old_params and old_params[name].shape == new_params[name].shape:
            plan[name] = old_params[name].detach().clone()
            report.copied.append(name)
            report.placed[name] = (name, (...,))
        elif name in old_params:
            raise SurgeryRefused(f"{name}: {tuple(old_params[name].shape)} -> "
                                 f"{tuple(new_params[name].shape)}, and it is in no chain "
                                 "the model declares: no transform for it")
        else:
            report.fresh.append(name)
    buffers = _buffer_plan(old, new, report)  # (refused here too: nothing written yet)
    with torch.no_grad():
        for name, param in new.named_parameters():
            if name in plan:
                param.copy_(plan[name])
        for name, buf in new.named_buffers():
            if name in buffers:
                buf.copy_(buffers[name])
    return report


def check(old: nn.Module, new: nn.Module, obs: torch.Tensor,
          inputs: Sequence[int] | None = None) -> dict[str, float]:
    """The largest absolute difference of each output the two models share, on ``obs``
    (the new model's observations; the old model sees its columns of them). A chain
    reading an inner output (a recurrent model's heads) is compared on random inputs of
    that output's width, as many as ``obs``."""
    reading = [c for c in chains_of(old) if c.reads == "obs"]
    if inputs is not None:
        old_obs = obs[..., list(inputs)]
    elif reading:  # the old features come first
        old_obs = obs[..., :_linear(old, reading[0].layers[0]).in_features]
    else:  # no chain reads the observation (an LSTM reading it directly): none compared
        old_obs = obs
    old_chains = {c.layers[-1]: c for c in chains_of(old)}
    diffs = {}
    inner = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for chain in chains_of(new):
            old_chain = _match(chain, old_chains)
            if chain.reads == "obs":
                x_old, x_new = old_obs, obs
            else:  # an inner output (an LSTM's, in [-1, 1]): random values of its width
                width = _linear(old, old_chain.layers[0]).in_features
                x_old = torch.rand(len(obs), width, generator=inner) * 2 - 1
                x_new = torch.zeros(len(obs), _linear(new, chain.layers[0]).in_features)
                x_new[:, :width] = x_old
            a, b = _chain_output(old, old_chain, x_old), _chain_output(new, chain, x_new)
            n = a.shape[-1]
            diffs[chain.output] = max(diffs.get(chain.output, 0.0),
                                      float((a - b[..., :n]).abs().max()))
    return diffs


# ----- one chain ------------------------------------------------------------------------
class Net2Net:
    """The built-in surgery part (``parts: {surgery: net2net}``, the default): the
    transforms of this module (:class:`zmqrl.parts.surgery.Surgery`), a layer inserted
    after a tanh at gain ``tanh_gain`` (a subclass named by import path may choose
    another).

    A caution, measured (BENCHMARKS.md, "Surgery"): deeper through tanh keeps the
    function but not the training. Adam moves every weight by ~lr a step whatever its
    scale, and the layer after the inserted one carries 1/gain: the outputs then move
    ~1/gain times faster than before. seed.yaml on CartPole carried to [128, 128, 128]
    played every episode at 500 after the surgery and collapsed some 80 updates later
    (to a policy pushing one way) in 3 of 4 runs, at gains 1e-3, 0.1 and 0.3 alike; the
    same run made wider only held. ReLU's identity (gain 1) has no such factor."""

    tanh_gain = 1e-3

    @classmethod
    def carry(cls, old: nn.Module, new: nn.Module, inputs: Sequence[int] | None = None,
              logit_tolerance: float = 1e-4) -> Report:
        return carry(old, new, inputs, logit_tolerance, eps=cls.tanh_gain)

    check = staticmethod(check)


def _match(chain: Chain, old_chains: dict[str, Chain]) -> Chain:
    found = old_chains.get(chain.layers[-1]) or next(
        (c for c in old_chains.values() if c.output == chain.output
         and c.layers[0] == chain.layers[0]), None)
    if found is None:
        raise SurgeryRefused(f"{chain.layers[-1]}: the old model has no {chain.output} "
                             "chain to carry into it")
    if found.activation != chain.activation:
        raise SurgeryRefused(f"{chain.layers[0]}: activation {found.activation} -> "
                             f"{chain.activation}: not the same function")
    if len(chain.layers) < len(found.layers):
        raise SurgeryRefused(f"{found.layers[-2]}: the new model has fewer layers in this "
                             f"chain ({len(found.layers)} -> {len(chain.layers)}): a removed "
                             "layer cannot be carried")
    return found


def _carry_chain(old: nn.Module, new: nn.Module, old_chain: Chain, chain: Chain,
                 inputs: Sequence[int] | None, logit_tolerance: float, eps: float,
                 plan: dict[str, torch.Tensor], report: Report, done: set[str]) -> None:
    old_layers = [_linear(old, n) for n in old_chain.layers]
    new_layers = [_linear(new, n) for n in chain.layers]
    hidden_old = len(old_layers) - 1
    inserted = len(new_layers) - len(old_layers)
    # new layer i's source: the old layer it carries, or None (an inserted identity)
    sources: list[int | None] = list(range(hidden_old)) + [None] * inserted + [hidden_old]
    # new column of each old input (a chain reading an inner output keeps its columns)
    columns = list(inputs) if inputs is not None and chain.reads == "obs" else None
    scale = 1.0  # the carried columns' factor (1 / eps after a tanh identity)
    for i, (name, layer) in enumerate(zip(chain.layers, new_layers, strict=True)):
        src = sources[i]
        if src is None:  # an inserted hidden layer: the identity on the old units
            # the old units (or, first in the chain, the old inputs) it passes on
            rows = list(columns) if columns is not None else \
                list(range(old_layers[0].in_features))
            weight = layer.weight.detach().clone()
            bias = layer.bias.detach().clone()
            if layer.out_features <= max(rows) or layer.in_features <= max(rows):
                raise SurgeryRefused(f"{name}: an inserted layer of {layer.out_features} "
                                     f"units cannot pass on the {len(rows)} before it")
            weight[rows] = 0.0
            gain = 1.0 if chain.activation == "relu" or scale != 1.0 else eps
            weight[rows, rows] = gain
            bias[rows] = 0.0
            if chain.activation == "tanh" and scale == 1.0:
                scale = 1.0 / eps
            how = ("identity on the old units" if gain == 1.0
                   else f"{eps:g} x identity (tanh), the next layer / {eps:g}")
            _plan(plan, report, done, name, weight, bias, how)
            columns = rows
            continue
        old_layer = old_layers[src]
        last = i == len(new_layers) - 1
        weight, bias, how = _grow(name, old_layer, layer, columns, scale,
                                  chain.output if last else "hidden", logit_tolerance)
        if scale == 1.0 and name not in done:  # the old values sit unchanged at these
            rows = slice(0, old_layer.out_features)
            cols = columns if columns is not None else slice(0, old_layer.in_features)
            source = old_chain.layers[src]
            report.placed[f"{name}.weight"] = (f"{source}.weight", (rows, cols))
            report.placed[f"{name}.bias"] = (f"{source}.bias", (rows,))
        _plan(plan, report, done, name, weight, bias, how)
        scale = 1.0
        columns = list(range(old_layer.out_features))  # old units keep their rows


def _grow(name: str, old: nn.Linear, new: nn.Linear, columns: list[int] | None,
          scale: float, output: str, logit_tolerance: float
          ) -> tuple[torch.Tensor, torch.Tensor, str]:
    """``new``'s weight and bias carrying ``old``'s: old rows on top (old input columns
    at ``columns``, the others zero), new rows as ``output`` asks."""
    cols = columns if columns is not None else list(range(old.in_features))
    if len(cols) != old.in_features:
        raise SurgeryRefused(f"{name}: {old.in_features} old inputs but {len(cols)} places "
                             "for them in the new input")
    if new.in_features < old.in_features or max(cols, default=-1) >= new.in_features:
        raise SurgeryRefused(f"{name}: {old.in_features} inputs -> {new.in_features}: an "
                             "input in use was removed")
    if new.out_features < old.out_features:
        raise SurgeryRefused(f"{name}: {old.out_features} outputs -> {new.out_features}: "
                             f"removed {'actions' if output == 'logits' else 'units'} "
                             "cannot be carried")
    weight, bias = new.weight.detach().clone(), new.bias.detach().clone()
    n = old.out_features
    weight[:n] = 0.0  # an old unit sees nothing new
    weight[:n, cols] = old.weight.detach() * scale
    bias[:n] = old.bias.detach()
    grew = []
    if new.in_features != old.in_features:
        grew.append(f"inputs {old.in_features} -> {new.in_features} (new columns 0)")
    if new.out_features > n:
        extra = new.out_features - n
        if output == "logits":
            mean_w, mean_b = weight[:n].mean(0), bias[:n].mean()
            weight[n:] = mean_w
            bias[n:] = mean_b - math.log(1.0 / logit_tolerance)
            grew.append(f"{extra} new action(s): logits below the old ones' mean by "
                        f"log(1/{logit_tolerance:g})")
        elif output == "advantage":
            weight[n:], bias[n:] = weight[:n].mean(0), bias[:n].mean()
            grew.append(f"{extra} new action(s): advantage = the old ones' mean")
        elif output == "hidden":
            grew.append(f"units {n} -> {new.out_features} (new units: fresh, unseen "
                        "downstream)")
        else:
            raise SurgeryRefused(f"{name}: {output} outputs {n} -> {new.out_features}: "
                                 "no transform adds those")
    if scale != 1.0:
        grew.append(f"carried columns x {scale:g}")
    return weight, bias, "; ".join(grew) or "copied"


def _plan(plan: dict[str, torch.Tensor], report: Report, done: set[str], name: str,
          weight: torch.Tensor, bias: torch.Tensor, how: str) -> None:
    if name in done:
        return
    done.add(name)
    plan[f"{name}.weight"], plan[f"{name}.bias"] = weight, bias
    # what touches only the weight's columns (new inputs, a scale) leaves the bias as it was
    bias_how = "; ".join(part for part in how.split("; ")
                         if not part.startswith(("inputs ", "carried columns"))) or "copied"
    for key, what in ((f"{name}.weight", how), (f"{name}.bias", bias_how)):
        if what == "copied":
            report.copied.append(key)
        else:
            report.transformed[key] = what


def _buffer_plan(old: nn.Module, new: nn.Module, report: Report) -> dict[str, torch.Tensor]:
    """Buffers (observation normalisation's running statistics) of the same shape."""
    old_buffers = dict(old.named_buffers())
    plan = {}
    for name, buf in new.named_buffers():
        if name in old_buffers and old_buffers[name].shape == buf.shape:
            plan[name] = old_buffers[name].detach().clone()
            report.copied.append(name)
        elif name in old_buffers:
            raise SurgeryRefused(f"{name}: {tuple(old_buffers[name].shape)} -> "
                                 f"{tuple(buf.shape)}: no transform for this buffer")
    return plan


def _linear(model: nn.Module, name: str) -> nn.Linear:
    module = model.get_submodule(name)
    if not isinstance(module, nn.Linear):
        raise SurgeryRefused(f"{name}: a {type(module).__name__}, not a Linear layer")
    return module


def _chain_output(model: nn.Module, chain: Chain, obs: torch.Tensor) -> torch.Tensor:
    """The chain's output for ``obs`` (flat float observations), computed layer by layer."""
    act = torch.tanh if chain.activation == "tanh" else torch.relu
    x = obs.reshape(obs.shape[0], -1).float()
    for i, name in enumerate(chain.layers):
        x = _linear(model, name)(x)
        if i < len(chain.layers) - 1:
            x = act(x)
    return x


def mlp_chains(model: nn.Module, heads: dict[str, str], activation: str) -> list[Chain]:
    """Chains of a model made of ``nn.Sequential`` MLPs: each entry of ``heads`` is a
    Sequential (its Linear layers are the chain) or a Linear fed by the Sequential named
    ``torso`` (the chain is the torso's layers then it), mapped to its output kind."""
    chains = []
    for head, output in heads.items():
        module = model.get_submodule(head)
        if isinstance(module, nn.Sequential):
            layers = tuple(f"{head}.{i}" for i, m in enumerate(module)
                           if isinstance(m, nn.Linear))
        else:
            torso = model.get_submodule("torso")
            layers = tuple(f"torso.{i}" for i, m in enumerate(torso)
                           if isinstance(m, nn.Linear)) + (head,)
        chains.append(Chain(layers, output, activation))
    return chains


def recurrent_chains(model: nn.Module, heads: dict[str, str], activation: str
                     ) -> list[Chain]:
    """Chains of a recurrent model: an MLP ``torso`` (a Sequential) feeding an LSTM
    ``core``, whose output feeds each Linear head of ``heads`` (name -> output kind).
    The torso is a chain of ``features`` (new observation features, deeper or wider
    inner layers; its output width is the LSTM's input and stays); each head reads the
    core. The LSTM itself is carried as it is, so its width cannot change."""
    torso = model.get_submodule("torso")
    layers = tuple(f"torso.{i}" for i, m in enumerate(torso) if isinstance(m, nn.Linear))
    chains = [Chain(layers, "features", activation)] if layers else []
    return chains + [Chain((head,), output, activation, reads="core")
                     for head, output in heads.items()]
