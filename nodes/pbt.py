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

Who may speak for a member (:class:`~zmqrl.run.population.Bindings`): the peer whose
report first named it; a report for a member bound to another peer is refused, and so is
a ``pbt_state`` from any peer but the one asked (the donor's, when the exploit began)
and a ``pbt_loaded`` from any but the recipient's. The binding passes on only when its
peer has gone (a restarted learner connects anew). Bindings are not checkpointed:
ZeroMQ names connections, and a restarted controller has all new ones, so after a
restart the first report per member binds again.

A member that cannot carry out its part answers ``error`` (a donor whose state is over
``network.max_message_bytes``, a recipient that refused a load): the exploit is dropped
at once and the error logged, once per member and text, not left to time out.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import zmq

from zmqrl.bus import messages, sockets, wire
from zmqrl.bus.node import Link, Node
from zmqrl.parts.checkpoint import JSON, Checkpointer, node_checkpoint
from zmqrl.run.population import (
    Bindings,
    Identity,
    Population,
    Settings,
    reported_hyperparameters_error,
)

# An exploit whose donor or recipient does not answer within this is dropped (the
# recipient's next ready point tries again).
_EXPLOIT_TIMEOUT_S = 30.0
_CONTEXT = messages.Context()  # pbt messages name no env or model shapes


def _identity(envelope: list) -> Identity:
    """A ROUTER envelope as a hashable value (its frames arrive as zmq.Frame)."""
    return tuple(f.bytes if isinstance(f, zmq.Frame) else bytes(f) for f in envelope)


@dataclass
class _Underway:
    """An exploit being carried out: to whom we sent what, and when it began."""

    started: float
    donor: Identity  # asked for its state (pbt_get_state)
    recipient: Identity  # to be sent the load
    loading: bool = False  # pbt_load sent: waiting for pbt_loaded


class PBTController(Node):
    binds = {"members": "router"}
    accepts = {"members": (wire.PBT_REPORT, wire.PBT_STATE, wire.PBT_LOADED, wire.ERROR)}
    # population.rank_by: rating — a league's ratings (player m<k> is member k's policy)
    links = {"ratings": Link("sub", required=False, hwm=4),
             # a league's games port: told of every exploit (the recipient's rating
             # becomes the donor's at once)
             "league": Link("dealer", required=False)}
    metrics_interval_s = 1.0

    @dataclass
    class Args:
        population: dict | None = None  # the topology's population section (expand sets it)
        checkpoint_every_s: float = 10.0
        # A member's binding passes to another peer after this long without a word from
        # its own (a peer that hangs, or a host gone without closing its connection);
        # a peer whose connection closed loses it at once.
        rebind_after_s: float = 30.0

    @classmethod
    def check_spec(cls, spec, topo) -> list[tuple[tuple, str]]:  # noqa: ANN001
        population = spec.args.get("population")
        if not population:
            return [(("nodes", spec.name, "args", "population"),
                     "a pbt node needs the topology's population section")]
        if isinstance(population, dict) and population.get("rank_by") == "rating" \
                and "ratings" not in spec.links:
            return [(("nodes", spec.name, "links"),
                     "population.rank_by: rating needs a 'ratings' link to a league's "
                     "ratings port (e.g. ratings: league.ratings)")]
        return []

    def setup(self) -> None:
        # with the algo section: perturbed values stay within its fields' ranges
        self.pop = Population(Settings.parse(self.args.population, self.ctx.topo.algo),
                              self.ctx.topo.seed)
        self.bindings = Bindings(self.args.rebind_after_s)
        self.underway: dict[int, _Underway] = {}  # recipient -> its exploit's peers
        self.member_errors: dict[int, str] = {}  # the last error each member answered
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
        identity = _identity(envelope)
        if msg.type == wire.ERROR:  # a member refused what we sent (never answered)
            self._on_error(identity, msg)
            return
        messages.check(msg, messages.spec(msg.type), _CONTEXT)
        f = msg.fields
        member = f["member"]
        if member >= self.pop.settings.size:
            raise wire.ProtocolError(f"member {member}: the population has "
                                     f"{self.pop.settings.size}")
        if msg.type == wire.PBT_REPORT:
            problem = reported_hyperparameters_error(f.get("hyperparameters")) or \
                self.bindings.claim(member, identity, time.monotonic(), self._gone)
            if problem:
                raise wire.ProtocolError(problem)
            self._on_report(member, identity, f)
            return
        if self.bindings.member_of(identity) != member:
            raise wire.ProtocolError(f"'{msg.type}' as member {member}: this peer does not "
                                     "report as that member")
        if msg.type == wire.PBT_STATE:
            self._on_state(member, identity, msg)
        else:
            self._on_loaded(member, identity, f)

    def on_ratings(self, _envelope: list, msg: wire.Message) -> None:
        """A league's ratings: each member's current policy is the player ``m<k>``."""
        if msg.type != wire.RATINGS:
            raise wire.ProtocolError(f"ratings link takes '{wire.RATINGS}', not '{msg.type}'")
        messages.check(msg, messages.spec(wire.RATINGS), _CONTEXT)  # names, bounded values
        ratings = msg.fields["ratings"]
        for member in range(self.pop.settings.size):
            if f"m{member}" in ratings:
                self.pop.on_rating(member, ratings[f"m{member}"])

    def _on_report(self, member: int, identity: Identity, f: dict[str, Any]) -> None:
        decision = self.pop.on_report(member, int(f["steps"]), f.get("mean_return"),
                                      dict(f.get("hyperparameters") or {}),
                                      bool(f.get("checkpointed")), int(f.get("updates") or 0),
                                      f.get("return_std"), int(f.get("episodes") or 0))
        if decision is None:
            return
        donor = self.bindings.peers.get(decision.donor)
        if donor is None or not self.send("members", wire.encode(
                wire.PBT_GET_STATE, request=member), list(donor)):
            self.pop.abandon(member)  # its donor is not connected: its next ready point
            return
        self.underway[member] = _Underway(time.monotonic(), donor, identity)

    def _on_state(self, donor: int, identity: Identity, msg: wire.Message) -> None:
        recipient = msg.fields["request"]
        decision, underway = self.pop.pending.get(recipient), self.underway.get(recipient)
        if decision is None or underway is None or decision.donor != donor \
                or underway.donor != identity or underway.loading:
            # a forgery, or late: that exploit was dropped
            raise wire.ProtocolError(f"no exploit waits for member {donor}'s state "
                                     f"(request {recipient})")
        frames = wire.encode(wire.PBT_LOAD, {"state": msg["state"]}, request=recipient,
                             donor=donor, hyperparameters=decision.hyperparameters)
        size = sum(memoryview(frame).nbytes for frame in frames)
        if size > self.max_message_bytes:  # the donor checks too, with headroom
            self._drop(recipient)
            self._log_member_error(donor, f"its state makes a pbt_load of {size} bytes, over "
                                          f"network.max_message_bytes = "
                                          f"{self.max_message_bytes}")
            return
        underway.loading = True
        if not self.send("members", frames, list(underway.recipient)):
            self._drop(recipient)  # the recipient has gone: its next ready point

    def _on_loaded(self, member: int, identity: Identity, f: dict[str, Any]) -> None:
        decision, underway = self.pop.pending.get(member), self.underway.get(member)
        if decision is None or underway is None or not underway.loading \
                or underway.recipient != identity or f["donor"] != decision.donor:
            raise wire.ProtocolError(f"member {member} has no load of member {f['donor']}'s "
                                     "state under way")
        known = self.pop.members.get(member)
        old = dict(known.hyperparameters) if known else {}
        self.pop.on_loaded(member)
        del self.underway[member]
        self._write_lineage({
            "time": time.time(), "recipient": member, "donor": decision.donor,
            "recipient_steps": self.pop.members[member].steps,
            "recipient_return": decision.recipient_return,  # when it was decided
            "donor_return": decision.donor_return, "donor_updates": f.get("donor_updates"),
            "rank_by": self.pop.settings.rank_by, "recipient_score": decision.recipient_score,
            "donor_score": decision.donor_score,
            "old_hyperparameters": old, "hyperparameters": decision.hyperparameters,
            "how": decision.how})
        self.checkpointer.save()
        if "league" in self.sockets:  # not answered; a lost one: games move the rating
            self.send("league", wire.encode(wire.EXPLOITED, recipient=member,
                                            donor=decision.donor, source=self.ctx.label),
                      flags=zmq.NOBLOCK)
        self.log.info("member %d copied member %d; hyperparameters %s", member,
                      decision.donor, decision.hyperparameters)

    def _on_error(self, identity: Identity, msg: wire.Message) -> None:
        """A member could not do its part of an exploit (its state is too large to send,
        a load it refused): drop that exploit now rather than let it time out."""
        member = self.bindings.member_of(identity)
        if member is None:
            return  # not a member's: nothing of ours to drop, and errors get no reply
        request = msg.fields.get("request")
        for recipient, u in list(self.underway.items()):
            if (u.donor == identity and not u.loading or u.recipient == identity and u.loading) \
                    and (type(request) is not int or request == recipient):
                self._drop(recipient)
        self._log_member_error(member, str(msg.fields.get("error"))[:500])

    def _log_member_error(self, member: int, text: str) -> None:
        """Once per member and text: a donor too large to copy says so at each ready point."""
        if self.member_errors.get(member) != text:
            self.member_errors[member] = text
            self.log.warning("member %d: %s", member, text)

    def _drop(self, recipient: int) -> None:
        self.pop.abandon(recipient)
        self.underway.pop(recipient, None)

    def _gone(self, identity: Identity) -> bool:
        """Whether ZeroMQ no longer has a connection to ``identity``: a pong nobody
        asked for (every node ignores one) is refused with EHOSTUNREACH (the socket is
        ROUTER_MANDATORY)."""
        try:
            sockets.send(self.sockets["members"], wire.encode(
                wire.PONG, node=self.ctx.label, incarnation=self.incarnation),
                list(identity), zmq.NOBLOCK)
        except zmq.Again:
            return False  # connected, with a full queue
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            return True
        return False

    def _write_lineage(self, row: dict[str, Any]) -> None:
        with self.lineage.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def after_poll(self) -> None:
        now = time.monotonic()
        for member, underway in list(self.underway.items()):
            if now - underway.started > _EXPLOIT_TIMEOUT_S:
                self.log.warning("exploit of member %d timed out; dropped", member)
                self._drop(member)
        self.checkpointer.maybe_save()

    def metrics(self) -> dict[str, Any]:
        row: dict[str, Any] = {"exploits": self.pop.exploits, "members": len(self.pop.members),
                               "bound_members": len(self.bindings.peers)}
        returns = [m.mean_return for m in self.pop.members.values() if m.mean_return is not None]
        if returns:
            row["best_return"] = round(max(returns), 2)
        ratings = [m.rating for m in self.pop.members.values() if m.rating is not None]
        if ratings:
            row["best_rating"] = round(max(ratings), 1)
        return row

    def teardown(self) -> None:
        self.checkpointer.save()
