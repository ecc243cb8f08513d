"""A learner's side of population-based training: reports, state out, state and
hyperparameters in, all by message on the learner's ``pbt`` link (nodes/pbt.py).

The learner stays a thin shell: it builds a :class:`PBTMember` when it has a ``pbt``
link and hands every message on that link to :meth:`PBTMember.on_message`.

* every ``report_every_s`` it sends ``pbt_report``: member, env steps, mean return of
  the last 20 episodes (``ranked_episodes``: the population section's, up to the 100 a
  learner keeps) finished since its last load (none until 5 have: the ones
  before were the policy it replaced, and would rank it as that policy), its
  hyperparameters, and whether it has a checkpoint on disk.
  The send never blocks: with the controller gone and the queue full, a report is
  dropped and counted (``pbt_reports_dropped``); the next one carries newer numbers;
* ``pbt_get_state``: reply ``pbt_state``, the model's and the algorithm's state dicts
  (weights *and* optimizer state) as one ``torch.save`` byte array, or ``error`` when
  that is more than one message may carry (``network.max_message_bytes``, named);
* ``pbt_load``: check everything first — the state decodes, holds exactly this model's
  and algorithm's entries with their shapes and dtypes, every number finite, and the
  hyperparameters are fields of this algorithm's config of the right type and in
  range — and only then load it, apply the hyperparameters, publish the parameters
  under a new version (a load counts as one update: followers hold every earlier
  version), checkpoint (so the load survives a crash before the controller records
  it), and answer ``pbt_loaded``. A load that fails a check gets ``error`` and the
  learner carries on with what it had.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import math
from typing import Any, Protocol

import numpy as np
import zmq

from zmqrl.bus import messages, wire
from zmqrl.bus.metrics import EpisodeStats
from zmqrl.parts import algo_config


class Learner(Protocol):
    """What a member reads and drives of its learner node (``nodes/learner.py``, which
    imports this module: a protocol, not that class)."""

    model: Any
    algo: Any
    updates: int
    source: Any
    checkpointer: Any
    log: Any
    max_message_bytes: int

    def send(self, link: str, frames: list, envelope: list | None = None,
             flags: int = 0) -> bool: ...

    def every(self, seconds: float, callback: Any) -> None: ...

    def _publish(self) -> None: ...

    def save_checkpoint(self) -> None: ...


_CONTEXT = messages.Context()  # pbt messages name no env or model shapes
RANKED_EPISODES = 20  # the mean return a report gives is over this many episodes (unless
# the population says otherwise) ...
MIN_FRESH_EPISODES = 5  # ... once this many have finished since the last load
# Room a donor leaves under the message cap for the controller's pbt_load, which carries
# the same state with a header of its own (new hyperparameters: at most 64 short ones).
LOAD_HEADROOM = 64 * 1024


def set_hyperparameters(algo: Any, hyper: dict[str, Any]) -> None:
    """Apply ``hyper`` live: the algorithm's config (a frozen dataclass) is replaced, so
    what its learner reads at each update changes; then the learner's
    ``apply_hyperparameters(changed)`` applies the rest (an optimizer's rates), or,
    where it has none, ``lr`` goes to every optimizer parameter group. Unknown names
    raise ValueError. (Validation allows a population only over the config's
    ``live_fields``: the ones this reaches.)"""
    if not hyper:
        return
    cfg = algo.cfg
    names = {f.name for f in dataclasses.fields(cfg)}
    unknown = set(hyper) - names
    if unknown:
        raise ValueError(f"unknown hyperparameters for {type(cfg).__name__}: {sorted(unknown)}")
    algo.cfg = dataclasses.replace(cfg, **hyper)
    apply = getattr(algo, "apply_hyperparameters", None)
    if apply is not None:
        apply(dict(hyper))
    elif "lr" in hyper:
        for group in algo.optimizer.param_groups:
            group["lr"] = float(hyper["lr"])


def hyperparameters_error(cfg: Any, hyper: Any) -> str | None:
    """What keeps ``hyper`` from being applied to the algorithm config ``cfg``, or None:
    each must be a field of it, of the field's type and in its declared range, and the
    config they make must pass the config's own checks (as ``zmqrl validate`` would)."""
    if not isinstance(hyper, dict):
        return "hyperparameters must be a map"
    if "kind" in hyper:
        return "hyperparameter 'kind': a member cannot change its algorithm"
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    found = algo_config.errors({**values, **hyper})
    if found:
        return "; ".join(f"hyperparameter '{key}': {text}" for key, text in found[:4])
    return None


def pack_state(learner: Learner) -> np.ndarray:
    import torch

    buf = io.BytesIO()
    torch.save({"model": learner.model.state_dict(), "algo": learner.algo.state_dict(),
                "updates": learner.updates}, buf)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


def unpack_state(array: np.ndarray) -> dict[str, Any]:
    import torch

    return torch.load(io.BytesIO(array.tobytes()), weights_only=True, map_location="cpu")


def state_error(state: Any, model: Any, algo: Any) -> str | None:
    """What keeps ``state`` (an unpacked ``pbt_state``) from loading into ``model`` and
    ``algo``, or None: it must be ``{model, algo, updates}`` with exactly the entries of
    their own state dicts, tensors of the same shapes and dtypes, every number finite."""
    if not isinstance(state, dict) or set(state) != {"model", "algo", "updates"}:
        keys = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
        return f"the state must hold model, algo and updates, not {keys}"
    updates = state["updates"]
    if type(updates) is not int or updates < 0:
        return f"updates: {updates!r:.40} is not a count"
    optimizer = getattr(algo, "optimizer", None)
    shapes = [tuple(p.shape) for g in getattr(optimizer, "param_groups", ())
              for p in g["params"]]
    return _mismatch(model.state_dict(), state["model"], "model", shapes) or \
        _mismatch(algo.state_dict(), state["algo"], "algo", shapes)


def _mismatch(mine: Any, theirs: Any, path: str, shapes: list[tuple]) -> str | None:
    """Where ``theirs`` differs in structure from ``mine`` (or holds a non-finite number)."""
    import torch

    if isinstance(mine, torch.Tensor):
        return _tensor_mismatch(theirs, path, tuple(mine.shape), mine.dtype)
    if isinstance(mine, dict):
        if not isinstance(theirs, dict):
            return f"{path}: {type(theirs).__name__}, not a map"
        if set(mine) == {"state", "param_groups"}:  # a torch optimizer's state dict
            return _optimizer_mismatch(mine, theirs, path, shapes)
        if set(mine) != set(theirs):
            odd = sorted(map(str, set(mine) ^ set(theirs)))[:3]
            return f"{path}: entries differ from this learner's ({odd})"
        return next((m for k in mine if (m := _mismatch(mine[k], theirs[k], f"{path}.{k}",
                                                        shapes))), None)
    if isinstance(mine, list | tuple):
        if type(theirs) is not type(mine) or len(theirs) != len(mine):
            return f"{path}: not a {type(mine).__name__} of {len(mine)}"
        return next((m for i, (a, b) in enumerate(zip(mine, theirs, strict=True))
                     if (m := _mismatch(a, b, f"{path}[{i}]", shapes))), None)
    if isinstance(mine, bool) or mine is None or isinstance(mine, str):
        return None if type(theirs) is type(mine) else f"{path}: {theirs!r:.40} is not " \
                                                       f"{type(mine).__name__}"
    if isinstance(mine, int | float):
        number = isinstance(theirs, int | float) and not isinstance(theirs, bool)
        if not number or (isinstance(mine, int) and not isinstance(theirs, int)):
            return f"{path}: {theirs!r:.40} is not {type(mine).__name__}"
        return None if math.isfinite(theirs) else f"{path}: {theirs!r} is not finite"
    return None if type(theirs) is type(mine) else f"{path}: {type(theirs).__name__}, " \
                                                   f"not {type(mine).__name__}"


def _tensor_mismatch(theirs: Any, path: str, shape: tuple | None, dtype: Any) -> str | None:
    import torch

    if not isinstance(theirs, torch.Tensor) or theirs.layout != torch.strided:
        return f"{path}: not a dense tensor"
    if dtype is not None and theirs.dtype != dtype:
        return f"{path}: {theirs.dtype}, not {dtype}"
    if shape is not None and tuple(theirs.shape) != shape:
        return f"{path}: shape {tuple(theirs.shape)}, not {shape}"
    if (theirs.is_floating_point() or theirs.is_complex()) and \
            not bool(torch.isfinite(theirs).all()):
        return f"{path}: holds non-finite values"
    return None


def _optimizer_mismatch(mine: dict, theirs: dict, path: str,
                        shapes: list[tuple]) -> str | None:
    """A torch optimizer's state dict: the same parameter groups; per-parameter state
    for known parameters only, as ours where we have it (Adam has none before its first
    step), else tensors of the parameter's shape or scalars (step counts)."""
    if set(theirs) != {"state", "param_groups"}:
        return f"{path}: not an optimizer state (state, param_groups)"
    problem = _mismatch(mine["param_groups"], theirs["param_groups"], f"{path}.param_groups",
                        shapes)
    if problem or not isinstance(theirs["state"], dict):
        return problem or f"{path}.state: not a map"
    for index, entry in theirs["state"].items():
        where = f"{path}.state[{index!r:.20}]"
        if type(index) is not int or not 0 <= index < len(shapes):
            return f"{where}: no such parameter"
        if index in mine["state"]:
            problem = _mismatch(mine["state"][index], entry, where, shapes)
        elif not isinstance(entry, dict):
            problem = f"{where}: not a map"
        else:
            problem = next((m for k, v in entry.items() if (m := _tensor_mismatch(
                v, f"{where}.{k}", None, None) or _scalar_or_shaped(
                v, f"{where}.{k}", shapes[index]))), None)
        if problem:
            return problem
    return None


def _scalar_or_shaped(value: Any, path: str, shape: tuple) -> str | None:
    return None if value.dim() == 0 or tuple(value.shape) == shape else \
        f"{path}: shape {tuple(value.shape)}, not {shape} or a scalar"


def ranked_returns(episodes: EpisodeStats, at_load: int,
                   last: int = RANKED_EPISODES) -> list[float] | None:
    """The returns that rank a member: of its ``last`` episodes finished
    since its last load (``at_load``: the episode count then), or None until
    ``MIN_FRESH_EPISODES`` have. The episodes before a load were the policy it replaced,
    and would rank it as that policy (and have it copy again at once)."""
    fresh = episodes.count - at_load
    if fresh < MIN_FRESH_EPISODES or not episodes.returns:
        return None
    return [float(r) for r in list(episodes.returns)[-min(last, fresh):]]


def return_summary(returns: list[float] | None) -> dict[str, float | int]:
    """A report's ``mean_return``, ``return_std`` (sample, ddof 1) and ``episodes`` of
    ``returns``; empty when there are none or they are not finite."""
    if not returns or not np.isfinite(returns).all():
        return {}
    summary: dict[str, float | int] = {"mean_return": float(np.mean(returns)),
                                       "episodes": len(returns)}
    if len(returns) > 1:
        summary["return_std"] = float(np.std(returns, ddof=1))
    return summary


class PBTMember:
    report_every_s = 1.0

    def __init__(self, learner: Learner, member: int, hyper: dict[str, Any],
                 ranked_episodes: int = RANKED_EPISODES):
        self.learner = learner
        self.member = member
        self.ranked_episodes = ranked_episodes
        self.hyper = dict(hyper)
        self.loads = 0
        self.refused = 0  # loads refused (a bad state or hyperparameters)
        self.reports_dropped = 0  # reports not sent: the controller's queue was full
        self.donor: int | None = None
        self.episodes_at_load = 0  # the source's episode count at our last load
        set_hyperparameters(learner.algo, self.hyper)
        learner.every(self.report_every_s, self.report)

    def _send(self, frames: list) -> bool:
        """Never blocks: a controller that has gone (a full queue) must not stop training."""
        return self.learner.send("pbt", frames, flags=zmq.NOBLOCK)

    def report(self) -> None:
        node = self.learner
        episodes = getattr(node.source, "episodes", None)
        extra = return_summary(ranked_returns(episodes, self.episodes_at_load,
                                              self.ranked_episodes)
                               if episodes is not None else None)
        if not self._send(wire.encode(
                wire.PBT_REPORT, member=self.member, steps=int(node.source.state()["env_steps"]),
                hyperparameters=self.hyper, checkpointed=node.checkpointer.path.exists(),
                updates=node.updates, **extra)):
            self.reports_dropped += 1

    def on_message(self, msg: wire.Message) -> None:
        if msg.type in (wire.PONG, wire.ERROR):
            return
        if msg.type not in (wire.PBT_GET_STATE, wire.PBT_LOAD):
            raise wire.ProtocolError(f"pbt link: unexpected '{msg.type}'")
        request = msg.fields.get("request")
        try:
            messages.check(msg, messages.spec(msg.type), _CONTEXT)
        except wire.ProtocolError as exc:
            self._refuse(request, str(exc))
            return
        if msg.type == wire.PBT_GET_STATE:
            self.give_state(request)
        else:
            self.load(msg)

    def _refuse(self, request: Any, text: str) -> None:
        """Answer ``error`` (with the request it answers, when that is a member index)."""
        self.learner.log.warning("pbt: %s", text)
        extra = {"request": request} if type(request) is int else {}
        self._send(wire.encode(wire.ERROR, error=text, **extra))

    def give_state(self, request: int) -> None:
        node = self.learner
        frames = wire.encode(wire.PBT_STATE, {"state": pack_state(node)}, member=self.member,
                             request=request, hyperparameters=self.hyper, updates=node.updates)
        size = sum(memoryview(frame).nbytes for frame in frames)
        limit = node.max_message_bytes
        if size + LOAD_HEADROOM > limit:
            self._refuse(request, (
                f"member {self.member}'s state is {size} bytes: with {LOAD_HEADROOM} for the "
                f"load's header that is over network.max_message_bytes = {limit}, so it "
                f"cannot be copied; raise network.max_message_bytes to at least "
                f"{size + LOAD_HEADROOM} to let PBT copy this model"))
            return
        if not self._send(frames):
            node.log.warning("pbt: state for member %d not sent (the controller's queue is "
                             "full)", request)

    def load(self, msg: wire.Message) -> None:
        """Check the whole load, then apply it; a bad one is refused with nothing touched."""
        node, request = self.learner, msg.fields["request"]
        hyper = msg.fields["hyperparameters"]
        problem = hyperparameters_error(node.algo.cfg, hyper)
        state = None
        if problem is None:
            try:
                state = unpack_state(msg.arrays["state"])
            except Exception as exc:  # noqa: BLE001 - garbage raises any of a dozen types
                problem = f"the state does not decode ({type(exc).__name__}: {str(exc)[:200]})"
        problem = problem or state_error(state, node.model, node.algo)
        if problem is not None:
            self.refused += 1
            self._refuse(request, f"load refused, kept the state I had: {problem}")
            return
        hyper = dict(hyper)
        saved = (copy.deepcopy(node.model.state_dict()), copy.deepcopy(node.algo.state_dict()),
                 node.algo.cfg)
        try:
            node.model.load_state_dict(state["model"])
            node.algo.load_state_dict(state["algo"])  # optimizer state too
            set_hyperparameters(node.algo, hyper)  # after: the donor's state holds its lr
        except Exception as exc:  # noqa: BLE001 - checked above; never leave it half loaded
            node.model.load_state_dict(saved[0])
            node.algo.load_state_dict(saved[1])
            node.algo.cfg = saved[2]
            self.refused += 1
            self._refuse(request, f"load refused, kept the state I had: {exc}")
            return
        self.hyper, self.loads, self.donor = hyper, self.loads + 1, msg.fields["donor"]
        episodes = getattr(node.source, "episodes", None)
        self.episodes_at_load = episodes.count if episodes is not None else 0
        # New parameters, so a new version: followers ignore one they already hold.
        node.updates += 1
        node._publish()
        try:  # durable before the controller records it in its lineage
            node.save_checkpoint()
        except OSError as exc:
            self._refuse(request, f"loaded, but the checkpoint failed ({exc}): not durable")
            return
        node.log.info("pbt: loaded member %s's state (update %s), hyperparameters %s",
                      self.donor, state["updates"], hyper)
        self._send(wire.encode(wire.PBT_LOADED, member=self.member, donor=self.donor,
                               request=request, donor_updates=int(state["updates"]),
                               hyperparameters=hyper))

    def state(self) -> dict[str, Any]:
        return {"hyperparameters": dict(self.hyper), "loads": self.loads,
                "donor": -1 if self.donor is None else self.donor}

    def restore(self, state: dict[str, Any]) -> None:
        self.hyper = dict(state["hyperparameters"])
        self.loads = int(state["loads"])
        self.donor = None if state["donor"] < 0 else int(state["donor"])
        set_hyperparameters(self.learner.algo, self.hyper)

    def metrics(self) -> dict[str, Any]:
        row: dict[str, Any] = {"pbt_loads": self.loads, "pbt_refused": self.refused,
                               "pbt_reports_dropped": self.reports_dropped,
                               "pbt_donor": -1 if self.donor is None else self.donor}
        row.update({f"hp_{k}": v for k, v in self.hyper.items()})
        return row
