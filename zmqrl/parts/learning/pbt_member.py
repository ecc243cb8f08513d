"""A learner's side of population-based training: reports, state out, state and
hyperparameters in, all by message on the learner's ``pbt`` link (nodes/pbt.py).

The learner stays a thin shell: it builds a :class:`PBTMember` when it has a ``pbt``
link and hands every message on that link to :meth:`PBTMember.on_message`.

* every ``report_every_s`` it sends ``pbt_report``: member, env steps, mean return of
  the last 20 episodes, its hyperparameters, and whether it has a checkpoint on disk;
* ``pbt_get_state``: reply ``pbt_state``, the model's and the algorithm's state dicts
  (weights *and* optimizer state) as one ``torch.save`` byte array;
* ``pbt_load``: load that state, apply the new hyperparameters, publish the parameters
  (the donor's update count as their version) and answer ``pbt_loaded``.
"""

from __future__ import annotations

import dataclasses
import io
import math
from typing import Any, Protocol

import numpy as np

from zmqrl.bus import messages, wire


class Learner(Protocol):
    """What a member reads and drives of its learner node (``nodes/learner.py``, which
    imports this module: a protocol, not that class)."""

    model: Any
    algo: Any
    updates: int
    source: Any
    checkpointer: Any
    log: Any

    def send(self, link: str, frames: list) -> None: ...

    def every(self, seconds: float, callback: Any) -> None: ...

    def _publish(self) -> None: ...


_CONTEXT = messages.Context()  # pbt messages name no env or model shapes


def set_hyperparameters(algo: Any, hyper: dict[str, Any]) -> None:
    """Apply ``hyper`` live: ``lr`` to every optimizer parameter group, the rest to the
    algorithm's config (a frozen dataclass: replaced); unknown names raise ValueError."""
    if not hyper:
        return
    cfg = algo.cfg
    names = {f.name for f in dataclasses.fields(cfg)}
    unknown = set(hyper) - names
    if unknown:
        raise ValueError(f"unknown hyperparameters for {type(cfg).__name__}: {sorted(unknown)}")
    algo.cfg = dataclasses.replace(cfg, **hyper)
    if "lr" in hyper:
        for group in algo.optimizer.param_groups:
            group["lr"] = float(hyper["lr"])


def pack_state(learner: Learner) -> np.ndarray:
    import torch

    buf = io.BytesIO()
    torch.save({"model": learner.model.state_dict(), "algo": learner.algo.state_dict(),
                "updates": learner.updates}, buf)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


def unpack_state(array: np.ndarray) -> dict[str, Any]:
    import torch

    return torch.load(io.BytesIO(array.tobytes()), weights_only=True, map_location="cpu")


class PBTMember:
    report_every_s = 1.0

    def __init__(self, learner: Learner, member: int, hyper: dict[str, Any]):
        self.learner = learner
        self.member = member
        self.hyper = dict(hyper)
        self.loads = 0
        self.donor: int | None = None
        set_hyperparameters(learner.algo, self.hyper)
        learner.every(self.report_every_s, self.report)

    def report(self) -> None:
        node = self.learner
        episodes = getattr(node.source, "episodes", None)
        mean = episodes.mean_return(20) if episodes is not None and episodes.count else None
        extra = {} if mean is None or math.isnan(mean) else {"mean_return": float(mean)}
        node.send("pbt", wire.encode(
            wire.PBT_REPORT, member=self.member, steps=int(node.source.state()["env_steps"]),
            hyperparameters=self.hyper, checkpointed=node.checkpointer.path.exists(),
            updates=node.updates, **extra))

    def on_message(self, msg: wire.Message) -> None:
        if msg.type in (wire.PBT_GET_STATE, wire.PBT_LOAD):
            messages.check(msg, messages.spec(msg.type), _CONTEXT)
        if msg.type == wire.PBT_GET_STATE:
            self.learner.send("pbt", wire.encode(
                wire.PBT_STATE, {"state": pack_state(self.learner)}, member=self.member,
                request=msg.fields.get("request", 0), hyperparameters=self.hyper,
                updates=self.learner.updates))
        elif msg.type == wire.PBT_LOAD:
            self.load(msg)
        elif msg.type not in (wire.PONG, wire.ERROR):
            raise wire.ProtocolError(f"pbt link: unexpected '{msg.type}'")

    def load(self, msg: wire.Message) -> None:
        node = self.learner
        state = unpack_state(msg.arrays["state"])
        hyper = dict(msg.fields["hyperparameters"])
        node.model.load_state_dict(state["model"])
        node.algo.load_state_dict(state["algo"])  # optimizer state too
        set_hyperparameters(node.algo, hyper)  # after: the donor's state holds its lr
        self.hyper, self.loads, self.donor = hyper, self.loads + 1, msg.fields["donor"]
        node._publish()
        node.log.info("pbt: loaded member %s's state (update %s), hyperparameters %s",
                      self.donor, state["updates"], hyper)
        node.send("pbt", wire.encode(wire.PBT_LOADED, member=self.member, donor=self.donor,
                                     request=msg.fields.get("request", 0),
                                     donor_updates=int(state["updates"]),
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
        row: dict[str, Any] = {"pbt_loads": self.loads,
                               "pbt_donor": -1 if self.donor is None else self.donor}
        row.update({f"hp_{k}": v for k, v in self.hyper.items()})
        return row
