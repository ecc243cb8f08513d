"""PBT controller: ranks a population's members and has the weak copy the strong.

Each member's learner (``args.member``, a ``pbt`` link to our ``members`` port: see
zmqrl/run/population.py, which writes both) sends ``pbt_report`` every second. At a
member's ready point (every ``ready_after_steps`` env steps) :class:`Population` decides;
an exploit asks the donor for its state (``pbt_get_state`` → ``pbt_state``: weights and
optimizer state), forwards it with the new hyperparameters to the recipient
(``pbt_load``), and when the recipient answers ``pbt_loaded`` appends one line to
``pbt/lineage.jsonl`` in the run directory and checkpoints.

The controller's state (members, ready points, hyperparameters, RNG) is a JSON
checkpoint, ``checkpoints/<label>.json``, restored when it starts.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from zmqrl.bus import messages, wire
from zmqrl.bus.node import Node
from zmqrl.parts.checkpoint import Checkpointer, Format, node_checkpoint
from zmqrl.run.population import Population, Settings, reported_hyperparameters_error

# An exploit whose donor or recipient does not answer within this is dropped (the
# recipient's next ready point tries again).
_EXPLOIT_TIMEOUT_S = 30.0
_CONTEXT = messages.Context()  # pbt messages name no env or model shapes


def _json_dump(state: dict[str, Any], f: BinaryIO) -> None:
    f.write(json.dumps(state).encode())


JSON = Format(".json", _json_dump, lambda path: json.loads(Path(path).read_text()))


class PBTController(Node):
    binds = {"members": "router"}
    accepts = {"members": (wire.PBT_REPORT, wire.PBT_STATE, wire.PBT_LOADED, wire.ERROR)}
    metrics_interval_s = 1.0

    @dataclass
    class Args:
        population: dict | None = None  # the topology's population section (expand sets it)
        checkpoint_every_s: float = 10.0

    @classmethod
    def check_spec(cls, spec, topo) -> list[tuple[tuple, str]]:  # noqa: ANN001
        if not spec.args.get("population"):
            return [(("nodes", spec.name, "args", "population"),
                     "a pbt node needs the topology's population section")]
        return []

    def setup(self) -> None:
        self.pop = Population(Settings.parse(self.args.population), self.ctx.topo.seed)
        self.envelopes: dict[int, list] = {}
        self.exploit_started: dict[int, float] = {}  # recipient -> when its exploit began
        self.lineage = self.ctx.run_dir / "pbt" / "lineage.jsonl"
        self.lineage.parent.mkdir(parents=True, exist_ok=True)
        self.checkpointer = Checkpointer(
            node_checkpoint(self.ctx.run_dir, self.ctx.label, JSON.suffix), self.pop,
            every_s=self.args.checkpoint_every_s, format=JSON, log=self.log)
        if self.checkpointer.restore_if_present():
            self.log.info("resumed: %d members, %d exploits", len(self.pop.members),
                          self.pop.exploits)

    def on_members(self, envelope: list, msg: wire.Message) -> None:
        if msg.type not in self.accepts["members"]:  # well-formed, but not for us
            raise wire.ProtocolError(f"the members port takes "
                                     f"{', '.join(self.accepts['members'])}, not '{msg.type}'")
        if msg.type == wire.ERROR:  # a member rejected what we sent; its exploit times out
            self.log.warning("a member answered: %s", msg.fields.get("error"))
            return
        messages.check(msg, messages.spec(msg.type), _CONTEXT)
        f = msg.fields
        if msg.type == wire.PBT_REPORT:
            problem = reported_hyperparameters_error(f.get("hyperparameters"))
            if problem:
                raise wire.ProtocolError(problem)
        member = f["member"]
        if member >= self.pop.settings.size:
            raise wire.ProtocolError(f"member {member}: the population has "
                                     f"{self.pop.settings.size}")
        self.envelopes[member] = envelope
        if msg.type == wire.PBT_REPORT:
            decision = self.pop.on_report(member, int(f["steps"]), f.get("mean_return"),
                                          dict(f.get("hyperparameters") or {}),
                                          bool(f.get("checkpointed")))
            if decision is not None and decision.donor in self.envelopes:
                self.exploit_started[member] = time.monotonic()
                self.send("members", wire.encode(wire.PBT_GET_STATE, request=member),
                          self.envelopes[decision.donor])
            elif decision is not None:
                self.pop.abandon(member)
        elif msg.type == wire.PBT_STATE:
            recipient = f.get("request")
            decision = self.pop.pending.get(recipient)
            if decision is None or decision.donor != member:
                return  # late: that exploit was dropped
            self.send("members", wire.encode(
                wire.PBT_LOAD, {"state": msg["state"]}, request=recipient, donor=member,
                hyperparameters=decision.hyperparameters), self.envelopes[recipient])
        elif msg.type == wire.PBT_LOADED:
            known = self.pop.members.get(member)
            old = dict(known.hyperparameters) if known else {}
            decision = self.pop.on_loaded(member)
            if decision is None:
                return
            self.exploit_started.pop(member, None)
            self._write_lineage({
                "time": time.time(), "recipient": member, "donor": decision.donor,
                "recipient_steps": self.pop.members[member].steps,
                "recipient_return": decision.recipient_return,  # when it was decided
                "donor_return": decision.donor_return, "donor_updates": f.get("donor_updates"),
                "old_hyperparameters": old, "hyperparameters": decision.hyperparameters,
                "how": decision.how})
            self.checkpointer.save()
            self.log.info("member %d copied member %d; hyperparameters %s", member,
                          decision.donor, decision.hyperparameters)

    def _write_lineage(self, row: dict[str, Any]) -> None:
        with self.lineage.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def after_poll(self) -> None:
        now = time.monotonic()
        for member, t0 in list(self.exploit_started.items()):
            if now - t0 > _EXPLOIT_TIMEOUT_S:
                self.log.warning("exploit of member %d timed out; dropped", member)
                self.pop.abandon(member)
                del self.exploit_started[member]
        self.checkpointer.maybe_save()

    def metrics(self) -> dict[str, Any]:
        row: dict[str, Any] = {"exploits": self.pop.exploits, "members": len(self.pop.members)}
        returns = [m.mean_return for m in self.pop.members.values() if m.mean_return is not None]
        if returns:
            row["best_return"] = round(max(returns), 2)
        return row

    def teardown(self) -> None:
        self.checkpointer.save()
