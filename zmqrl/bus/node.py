"""The node runtime: what every process in a topology is built on.

A :class:`Node` subclass declares the ports it binds and the links it connects, a
dataclass of ``Args``, and ``on_<port>`` handlers. The base class makes the sockets
(through :mod:`zmqrl.bus.sockets`), runs one poll loop, rejects bad messages with a logged
error (and an ``error`` reply on ROUTER ports) while it keeps serving, answers ``ping``
on every ROUTER port, reports hello/heartbeat/metrics to the supervisor when there is
one, writes its metrics CSV into the run directory, and stops cleanly on SIGTERM/SIGINT.
When the topology configures CURVE and the node binds tcp, it also runs the process's
ZAP handler (:mod:`zmqrl.bus.security`) for as long as its sockets are open.

Producers send experience through an :class:`Outbox` (credit-based flow control); the
runtime routes the consumer's ``credit``/``error``/``pong`` replies to it. A node that
binds an XPUB port hears of new subscribers through :meth:`Node.on_subscribe`.

Lifetime: a node stops on SIGTERM, SIGINT and SIGHUP, and when the process that started
it (supervisor or watchdog, named by ``ZMQRL_PARENT_PID``) is gone (:mod:`zmqrl.bus.lifetime`).

A link declared ``many`` (:class:`Link`) names a list of targets in the topology
(``links: {params: [learner_m0.params, learner_m1.params]}``: a node shared by a
population's members, zmqrl.run.population): one socket per target, named
``<link>_<i>``, and ``on_<link>(i, envelope, msg)`` says which target spoke.

Peer liveness (the ZeroMQ Guide's Paranoid Pirate, client side): every DEALER link
notes when it last heard anything from its peer. Silent for ``network.heartbeat_s`` (1 s),
it pings (every ROUTER port answers ``pong``); silent for ``network.peer_timeout_s``
(5 s), the peer is declared dead: logged once, counted (``silent_peers``), and
:meth:`Node.on_peer_silent` runs, where a node reconnects and resends what it waits for.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import zmq

from zmqrl.bus import cores, lifetime, roles, security, sockets, wire
from zmqrl.bus import tensorboard as tb
from zmqrl.bus.cores import CorePlan
from zmqrl.bus.endpoints import Endpoints, remove_ipc_dir
from zmqrl.bus.labels import label as make_label
from zmqrl.bus.loglimit import LimitedLog
from zmqrl.bus.metrics import CsvLog, RecentReturns
from zmqrl.bus.spec import NodeSpec, TopologySpec
from zmqrl.bus.status import NodeStatus

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0  # to the supervisor, and the default peer ping interval
PEER_TIMEOUT_S = 5.0  # default: a link peer silent this long is declared dead
# The loop wakes at least this often, so a stop signal is honoured within it.
MAX_POLL_MS = 100
# Set by whoever starts a node process (supervisor, watchdog): the node stops when that
# process is gone, checked this often (and signalled by the kernel, see lifetime.py).
PARENT_PID_ENV = "ZMQRL_PARENT_PID"
PARENT_CHECK_S = 0.5
# Set by a supervisor for each process it starts (new for every start): the node says it
# in its hello, and the supervisor believes a label's reports only from the peer that
# did (zmqrl.run.runmetrics). An env var, not an argument: kept out of `ps`.
SECRET_ENV = "ZMQRL_NODE_SECRET"
# Episode returns one metrics report carries at most (the newest; the rest are counted
# in its episodes_more): ~90 KB of header, far under the 1 MiB cap.
MAX_EPISODES_PER_REPORT = 10_000


@dataclass(frozen=True)
class Link:
    """A socket a node connects to another node's bound port.

    ``many``: the topology may give a list of targets (``node.port`` each); the node
    then has one socket per target, ``<link>_<i>`` in list order (:meth:`Node.link_sockets`),
    and its handler is ``on_<link>(i, envelope, msg)``."""

    socket: str  # "dealer" | "sub" | "push"
    required: bool = True
    hwm: int | None = None  # queue bound, if not the default (see sockets.SocketOptions)
    immediate: bool = False  # see sockets.SocketOptions.immediate
    many: bool = False  # one socket per target of a list (above)


@dataclass
class NodeContext:
    """Everything a node needs to know about where it runs."""

    topo: TopologySpec
    spec: NodeSpec
    replica: int
    run_dir: Path
    endpoints: Endpoints
    supervisor: str | None = None  # address of the supervisor's ROUTER, if any
    cores: CorePlan | None = None  # this process's pinning (zmqrl.bus.cores), if any

    @property
    def label(self) -> str:
        return make_label(self.spec.name, self.replica, self.spec.replicas)


@dataclass
class NoArgs:
    pass


class Outgoing(Protocol):
    """What a node's loop needs of an outbox (an :class:`Outbox`, or several seen as one):
    flush it, and hold its producers while it is full."""

    def flush(self) -> None: ...

    @property
    def full(self) -> bool: ...

    def __len__(self) -> int: ...


class Outbox:
    """Experience for one consumer, sent under credit-based flow control.

    The consumer (learner, replay) grants one ``credit`` per message it has taken in;
    we start with ``credit`` and never have more than that many messages unconsumed
    anywhere between us and it. So the data a consumer trains on is at most that many
    messages old, whatever the ZeroMQ and kernel buffers could hold (those made a
    policy lag of ~8 updates with queue bounds alone). Messages that have no credit
    wait here, at most ``limit`` of them; a producer checks ``full`` and stops
    producing (stops reading actor requests, stops stepping envs). A slow consumer
    therefore slows the actors instead of growing memory or losing data.

    The runtime routes every ``credit``, ``error`` and ``pong`` on the link to the
    outbox registered for it (:meth:`on_reply`); nodes need no handler for them.

    **A restarted consumer** loses the messages it had not granted yet, and with them
    our credit. Each ``credit`` and ``pong`` names the consumer replica (``node``) and
    its ``incarnation``; a replica seen with a new incarnation (or for the first time
    while messages are outstanding) starts a *recount*: we hold our messages and ping
    every replica of the link; a consumer answers a ping only after everything we sent
    before it (it handles a port's messages in order and grants on receipt, or stops
    reading while it holds one back), so once every replica has answered, every
    message not granted is lost for good and none is in flight: credit starts again
    at ``credit``. A consumer that is merely slow or stopped (SIGSTOP, a checkpoint, a
    rate limiter) keeps its incarnation, so nothing is ever sent beyond the credit.
    """

    def __init__(self, node: Node, name: str, limit: int, credit: int = 2,
                 credit_timeout_s: float | None = None):
        # credit_timeout_s: accepted for compatibility and ignored; credit is restored
        # by incarnation (above), never by a timer.
        self.node = node
        self.name = name
        self.limit = limit
        self.initial_credit = credit
        self.credit = credit
        self._queue: deque[list] = deque()
        self._incarnations: dict[str, str] = {}  # consumer replica label -> incarnation
        self._recount_seq: int | None = None  # pings numbered >= this answer the recount
        self._recount_answered: set[str] = set()
        self._ping_seq = 0
        self._pinged_at = 0.0
        self.sent = 0  # messages sent, ever
        self.granted = 0  # credit granted, ever
        self.recounts = 0
        self.rejected = 0  # messages the consumer answered with ``error`` (credit back)
        node.register_outbox(self)

    def push(self, frames: list) -> None:
        self._queue.append(frames)
        self.flush()

    def grant(self, n: int) -> None:
        self.granted += n
        self.credit = min(self.credit + n, self.initial_credit)
        self.flush()

    def flush(self) -> None:
        if self._recount_seq is not None:
            self._ping_for_recount()
            return
        while self._queue and self.credit > 0 and \
                self.node.send(self.name, self._queue[0], flags=zmq.NOBLOCK):
            self._queue.popleft()
            self.credit -= 1
            self.sent += 1

    # ----- replies from the consumer ------------------------------------------------
    def on_reply(self, msg: wire.Message) -> None:
        """A ``credit``, ``error`` or ``pong`` that arrived on our link."""
        if msg.type == wire.CREDIT:
            n = msg.fields.get("n")
            if type(n) is not int or n < 1:
                raise wire.ProtocolError(f"credit 'n' must be a positive int, got {n!r}")
            self._saw(msg)
            self.grant(n)
        elif msg.type == wire.PONG:
            self._saw(msg)
            seq, label = msg.fields.get("seq"), msg.fields.get("node")
            if self._recount_seq is not None and type(seq) is int \
                    and seq >= self._recount_seq and isinstance(label, str):
                self._recount_answered.add(label)
                if len(self._recount_answered) >= self.node.link_replicas(self.name):
                    self._end_recount()
        elif msg.type == wire.ERROR:
            # The consumer took one of our messages in and refused it (a replay an
            # insert too large for its rate limiter, say): that message is done with,
            # so its credit comes back, or a few refusals would stop us for good.
            self.rejected += 1
            self.node.bad_messages += 1
            self.node.log_rejection(self.name, f"our message was rejected: "
                                               f"{msg.fields.get('error')}")
            self.grant(1)
        else:
            raise wire.ProtocolError(f"expected '{wire.CREDIT}' or '{wire.ERROR}', "
                                     f"got '{msg.type}'")

    def _saw(self, msg: wire.Message) -> None:
        label, incarnation = msg.fields.get("node"), msg.fields.get("incarnation")
        if not isinstance(label, str) or not isinstance(incarnation, str):
            return  # a consumer that does not say who it is: no recount possible
        known = self._incarnations.get(label)
        if known == incarnation:
            return
        if known is None and len(self._incarnations) >= 64:
            raise wire.ProtocolError("too many consumer replicas on one link")
        self._incarnations[label] = incarnation
        if known is not None:
            self.node.log.info("'%s' consumer %s restarted (incarnation %s -> %s): "
                               "recounting credit", self.name, label, known, incarnation)
            self._start_recount()
        elif self.sent > self.granted:
            self._start_recount()  # it may be a restart we never saw the first life of

    def _start_recount(self) -> None:
        self.recounts += 1
        self._recount_seq = self._ping_seq + 1
        self._recount_answered = set()
        self._pinged_at = 0.0
        self._ping_for_recount()

    def _ping_for_recount(self) -> None:
        """One ping per consumer replica (the DEALER deals them round-robin), again
        every heartbeat until each replica has answered one."""
        now = time.monotonic()
        if now - self._pinged_at < self.node.heartbeat_s:
            return
        self._pinged_at = now
        for _ in range(self.node.link_replicas(self.name)):
            self._ping_seq += 1
            self.node.send(self.name, wire.encode(wire.PING, seq=self._ping_seq),
                           flags=zmq.NOBLOCK)

    def _end_recount(self) -> None:
        lost = self.sent - self.granted
        if lost > 0:
            self.node.log.info("'%s' credit recounted: %d message(s) lost with a consumer",
                               self.name, lost)
        self.granted = self.sent  # the lost ones will never be granted
        self._recount_seq = None
        self.credit = self.initial_credit
        self.flush()

    @property
    def recounting(self) -> bool:
        return self._recount_seq is not None

    @property
    def full(self) -> bool:
        return len(self._queue) >= self.limit

    def __len__(self) -> int:
        return len(self._queue)


class Node:
    binds: ClassVar[dict[str, str]] = {}  # port -> "router" | "pub" | "pull"
    port_hwm: ClassVar[dict[str, int]] = {}  # per-port queue bounds, where not the default
    # "pub" ports bound as XPUB (sockets.SocketOptions.xpub): the runtime reads their
    # subscription frames (not wire messages) and calls :meth:`on_subscribe`, once per
    # loop turn, when anyone subscribed. (A node that does not override on_subscribe
    # reads the frames itself; the runtime then leaves the socket alone.)
    xpub_ports: ClassVar[frozenset[str]] = frozenset()
    # Message types each bound ROUTER port takes (besides ping and describe), for
    # ``describe``.
    accepts: ClassVar[dict[str, tuple[str, ...]]] = {}
    # What the run counts this node for (zmqrl.bus.roles), said in its hello.
    role: ClassVar[str] = roles.NONE
    # Fields of its metrics rows the run's progress line shows, each pooled over the
    # node's replicas by "sum" or "last" (zmqrl.bus.roles.POOLING); said in its hello.
    shows: ClassVar[dict[str, str]] = {}
    links: ClassVar[dict[str, Link]] = {}
    Args: ClassVar[type] = NoArgs
    metrics_interval_s: ClassVar[float] = 2.0

    def __init__(self, ctx: NodeContext):
        self.ctx = ctx
        self.args = self.Args(**ctx.spec.args)
        self.log = logging.getLogger(ctx.label)
        self.incarnation = uuid.uuid4().hex[:12]
        self.stopping = False
        self.started = time.monotonic()
        self.bad_messages = 0
        # rejections logged at most 20 per 10 s: a hostile peer must not fill the disk
        self._rejections_log = LimitedLog(self.log)
        self.dropped = 0  # messages we chose not to deliver (full queues, gone peers)
        # Returns of episodes finished since the last metrics report; the supervisor
        # pools them from every node into the run's "mean of the last 100 episodes".
        self.episode_log = RecentReturns(MAX_EPISODES_PER_REPORT)
        # Messages over the limit get a logged error and an error reply. The socket's own
        # cap sits above it: frames past that make ZeroMQ drop the connection outright,
        # so a hostile peer cannot make us buffer an unbounded frame.
        self.max_message_bytes = int(
            ctx.topo.network.get("max_message_bytes", wire.MAX_MESSAGE_BYTES))
        # CURVE keys for tcp endpoints, if the topology turns it on (ipc stays plain).
        self.curve = security.keys_for(ctx.topo)
        self._auth: security.Authenticator | None = None
        self.socket_options = sockets.SocketOptions(max_frame_bytes=2 * self.max_message_bytes,
                                                    curve=self.curve)
        self._zctx = zmq.Context.instance()
        self.sockets: dict[str, zmq.Socket] = {}
        self._traffic: dict[str, list[int]] = {}  # name -> [msgs_in, bytes_in, msgs_out, bytes_out]
        self._poller = zmq.Poller()
        self._paused: set[str] = set()
        self._link_of: dict[str, str] = {}  # extra sockets (open_link, many) -> their link
        self._target_of: dict[str, str] = {}  # link socket -> the "node.port" it connects to
        self._custom_handlers: dict[str, Callable] = {}
        self._handlers: dict[zmq.Socket, tuple[str, Callable | None, bool]] = {}
        self._timers: list[list] = []  # [next_due, period, fn]
        self._supervisor: zmq.Socket | None = None
        self._metrics_log = CsvLog(ctx.run_dir / "metrics" / f"{ctx.label}.csv")
        # The same rows as TensorBoard scalars, and the latest one in status/<label>.json
        # (for ``zmqrl status``): both written from the metrics path, never the hot path.
        self._board = tb.NodeBoard(ctx.run_dir, ctx.label, ctx.spec.kind or ctx.spec.impl)
        self._status = NodeStatus(ctx.run_dir, ctx.label, ctx.spec.name, ctx.replica,
                                  ctx.spec.kind or ctx.spec.impl, self.incarnation,
                                  self.metrics_interval_s, ctx.topo.name,
                                  str(ctx.topo.env.get("id", "")))
        self._last_traffic: dict[str, list[int]] = {}
        self._last_metrics_t = self.started
        self._last_cpu_s = time.process_time()
        self.heartbeat_s = float(ctx.topo.network.get("heartbeat_s", HEARTBEAT_S))
        self.peer_timeout_s = float(ctx.topo.network.get("peer_timeout_s", PEER_TIMEOUT_S))
        self._heard: dict[str, float] = {}  # DEALER socket -> when its peer last spoke
        self._silent: set[str] = set()  # DEALER sockets whose peer is declared dead
        self.silent_peers = 0  # times a link peer was declared dead
        self._outboxes: dict[str, Outbox] = {}  # link socket -> its Outbox
        self._xpub: dict[zmq.Socket, str] = {}  # XPUB sockets the runtime reads -> port
        self._subscribed: set[str] = set()  # XPUB ports with a new subscriber this turn
        self._env_fields: dict[str, Any] | None = None  # for describe, made when asked
        # Exit when whoever started us is gone (the supervisor or the node watchdog set
        # ZMQRL_PARENT_PID): see zmqrl.bus.lifetime.
        parent = os.environ.pop(PARENT_PID_ENV, None)  # not for processes we start
        self._parent = lifetime.ParentWatch(int(parent)) if parent else None
        self._secret = os.environ.pop(SECRET_ENV, None)  # likewise: ours alone

    @classmethod
    def largest_insert(cls, spec: NodeSpec, topo: TopologySpec) -> int | None:
        """The most items one ``insert`` of this node (on its ``experience`` link) can
        carry, as far as the topology tells; None: it cannot tell. A replay's rate
        limiter checks that such an insert can ever fit."""
        return None

    @classmethod
    def revise_batch(cls, spec: NodeSpec, topo: TopologySpec) -> int | None:
        """The most items one revision peek of this node (a ``sample`` with
        ``revise: true``) asks a replay for; None: it revises nothing. A replay serves
        revision peeks only to the nodes linked to it that say so, at most this many
        items each."""
        return None

    @classmethod
    def check_spec(cls, spec: NodeSpec, topo: TopologySpec) -> list[tuple[tuple, str]]:
        """Node-specific checks of a topology entry, as (field path, message) pairs."""
        return []

    @classmethod
    def runs_torch(cls, spec: NodeSpec) -> bool:
        """Whether this node, as ``spec`` configures it, runs a torch model. ``zmqrl up``
        forks such a node from its template with torch already loaded
        (:mod:`zmqrl.run.forkstart`); one that runs none (a remote actor, a replay) starts
        as a fresh interpreter that never imports torch, and stays small."""
        return True

    # ----- wiring -------------------------------------------------------------------
    def port_frame_cap(self, port: str) -> int | None:
        """The largest frame an honest peer sends to bound ``port``, where this node knows
        one below the network's cap; None: the network's cap. It becomes the socket's
        ZMQ_MAXMSGSIZE, so ZeroMQ drops a peer that announces a larger frame before
        buffering it (called before :meth:`setup`: from the topology alone)."""
        return None

    def _open_sockets(self) -> None:
        opts = self.socket_options
        bind_addresses = {port: self.ctx.endpoints.bind_address(self.ctx.spec.name, port,
                                                                self.ctx.replica)
                          for port in self.binds}
        if self.curve is not None and any(map(security.is_tcp, bind_addresses.values())):
            # Before the first bind: a client must never meet a CURVE server without
            # its ZAP handler (the sockets would refuse it anyway; see security.py).
            self._auth = security.Authenticator(self._zctx, self.curve, self.log)
            self._auth.start()
        for port, kind in self.binds.items():
            address = bind_addresses[port]
            if address.startswith("ipc://"):
                Path(address[6:]).unlink(missing_ok=True)  # a stale file from a dead process
            cap = self.port_frame_cap(port)
            port_opts = dataclasses.replace(
                opts, hwm=self.port_hwm.get(port, opts.hwm), xpub=port in self.xpub_ports,
                max_frame_bytes=opts.max_frame_bytes if cap is None
                else min(cap, opts.max_frame_bytes))
            sock = sockets.bind(self._zctx, kind, address, port_opts)
            if port in self.xpub_ports and type(self).on_subscribe is not Node.on_subscribe:
                self._xpub[sock] = port
                self._poller.register(sock, zmq.POLLIN)
            self._add_socket(port, sock)
        for name, link in self.links.items():
            if name not in self.ctx.spec.links:
                continue
            if not link.many:
                self._target_of[name] = self.ctx.spec.targets(name)[0]
                self._add_socket(name, self._connect_link(name))
                continue
            handler = getattr(self, f"on_{name}", None)
            for index, target in enumerate(self.ctx.spec.targets(name)):
                socket_name = f"{name}_{index}"
                self._link_of[socket_name] = name
                self._target_of[socket_name] = target
                if handler is not None:  # bound to its index; kept across reopen()
                    self._custom_handlers[socket_name] = functools.partial(handler, index)
                self._add_socket(socket_name, self._connect_link(socket_name))
        if self.ctx.supervisor:
            sup_opts = dataclasses.replace(opts, hwm=100, linger_ms=200)
            self._supervisor = sockets.connect(
                self._zctx, "dealer", [self.ctx.supervisor], sup_opts
            )

    def open_link(self, link: str, name: str) -> str:
        """One more socket on ``link`` (same targets), named ``name``; returns the name.
        Give it a handler with :meth:`set_handler`. For a many-link, ``link`` names one
        of its sockets (``<link>_<i>``): the new one connects to that target."""
        if link not in self._target_of:
            many = self.link_sockets(link)
            raise ValueError(f"'{link}' is no connected link socket of this node"
                             + (f" (a many-link: name one of {', '.join(many)})" if many else ""))
        self._link_of[name] = self._link_of.get(link, link)
        self._target_of[name] = self._target_of[link]
        self._add_socket(name, self._connect_link(name))
        return name

    def link_sockets(self, link: str) -> list[str]:
        """The sockets of ``link`` in target order: ``[link]`` for a connected plain link,
        ``<link>_0``, ``<link>_1``, ... for a many-link; none when the link is not given.
        (Extra sockets of :meth:`open_link` are not among them.)"""
        declared = self.links.get(link)
        if declared is None or not declared.many:
            return [link] if link in self._target_of else []
        return [f"{link}_{i}" for i in range(len(self.ctx.spec.targets(link)))
                if f"{link}_{i}" in self._target_of]

    def set_handler(self, name: str, handler: Callable[[list, wire.Message], None]) -> None:
        sock = self.sockets[name]
        if sock not in self._handlers:
            self._poller.register(sock, zmq.POLLIN)
        self._handlers[sock] = (name, handler, sock.type == zmq.ROUTER)
        self._custom_handlers[name] = handler

    def _connect_link(self, name: str) -> zmq.Socket:
        link = self.links[self._link_of.get(name, name)]
        addresses = self.ctx.endpoints.link_addresses(self._target_of[name])
        opts = dataclasses.replace(self.socket_options, hwm=link.hwm or self.socket_options.hwm,
                                   immediate=link.immediate)
        return sockets.connect(self._zctx, link.socket, addresses, opts)

    def reopen(self, name: str) -> None:
        """Close a link socket and connect a fresh one (new identity, empty queues)."""
        old = self.sockets[name]
        if old in self._handlers:
            del self._handlers[old]
            self._poller.unregister(old)
        old.close(linger=0)
        self._add_socket(name, self._connect_link(name))

    def _add_socket(self, name: str, sock: zmq.Socket) -> None:
        self.sockets[name] = sock
        if sock.type == zmq.DEALER:
            self._heard[name] = time.monotonic()
        self._traffic.setdefault(name, [0, 0, 0, 0])
        handler = self._custom_handlers.get(name) or getattr(self, f"on_{name}", None)
        if handler is not None or sock.type == zmq.ROUTER or name in self._outboxes:
            self._handlers[sock] = (name, handler, sock.type == zmq.ROUTER)
            self._poller.register(sock, zmq.POLLIN)

    def set_polling(self, name: str, enabled: bool) -> None:
        """Stop or resume reading a socket (backpressure: let its queue fill up)."""
        sock = self.sockets[name]
        if enabled:
            self._paused.discard(name)
            self._poller.register(sock, zmq.POLLIN)
        else:
            self._paused.add(name)  # also ends a drain of this socket in progress
            self._poller.unregister(sock)

    def log_rejection(self, port: str, line: str) -> None:
        """Log a rejected message (ours or a peer's), rate-limited (:mod:`zmqrl.bus.loglimit`)."""
        self._rejections_log.error(line)

    def send(self, name: str, frames: list, envelope: list | None = None, flags: int = 0) -> bool:
        """Send on a named socket. False if it would block (NOBLOCK and a full queue: the
        caller decides) or the ROUTER peer is gone (counted in ``dropped``).

        Replies (with an ``envelope``) never block: a peer that does not read its
        replies must not be able to stall us, so what it does not take is dropped and
        counted.
        """
        if envelope:
            flags |= zmq.NOBLOCK
        try:
            sockets.send(self.sockets[name], frames, envelope, flags)
        except zmq.Again:
            if envelope:
                self.dropped += 1
            return False
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            self.dropped += 1
            return False
        stats = self._traffic[name]
        stats[2] += 1
        stats[3] += sum(memoryview(f).nbytes for f in frames)
        return True

    def register_outbox(self, outbox: Outbox) -> None:
        """Route the ``credit``, ``error`` and ``pong`` replies on ``outbox.name`` to it
        (:class:`Outbox` does this itself when it is made)."""
        self._outboxes[outbox.name] = outbox
        sock = self.sockets.get(outbox.name)
        if sock is not None and sock not in self._handlers:  # a link with no handler of its own
            self._handlers[sock] = (outbox.name, None, False)
            self._poller.register(sock, zmq.POLLIN)

    def link_replicas(self, name: str) -> int:
        """How many bound ports (replicas) the link socket ``name`` connects to."""
        return max(1, len(self.ctx.endpoints.link_addresses(self._target_of[name])))

    def every(self, seconds: float, fn: Callable[[], None]) -> None:
        self._timers.append([time.monotonic() + seconds, seconds, fn])

    def on_producer_reply(self, _envelope: list, msg: wire.Message) -> None:
        """Deprecated: the runtime now routes ``credit``/``error``/``pong`` on a link to
        its registered :class:`Outbox`, so ``on_experience = on_producer_reply`` only
        sees other message types (rejected as before). Kept so nodes that still
        declare it keep working."""
        self.outbox.on_reply(msg)

    @staticmethod
    def expect_reply(msg: wire.Message, msg_type: str, peer: str) -> None:
        """Check a reply to our own request: an ``error`` means we sent something wrong
        (a bug or a mismatched topology, so raise and let the restart policy act); any
        other unexpected type is the peer's fault (a protocol error, logged)."""
        if msg.type == wire.ERROR:
            raise RuntimeError(f"{peer} rejected our request: {msg.fields.get('error')}")
        if msg.type != msg_type:
            raise wire.ProtocolError(f"expected '{msg_type}' from {peer}, got '{msg.type}'")

    def grant_credit(self, name: str, envelope: list, n: int = 1) -> None:
        """Consumer side of :class:`Outbox`: let that producer send ``n`` more."""
        # Who we are, so a producer can tell our restart from our being slow (Outbox).
        self.send(name, wire.encode(wire.CREDIT, n=n, node=self.ctx.label,
                                    incarnation=self.incarnation), envelope)

    # ----- hooks for subclasses -----------------------------------------------------
    def setup(self) -> None:
        """Build envs/models. Sockets exist already."""

    def after_poll(self) -> None:
        """Called once per loop turn after every ready socket was drained (batching)."""

    def poll_timeout_ms(self) -> int:
        return MAX_POLL_MS

    def metrics(self) -> dict[str, Any]:
        """This node's own metrics row (the base adds traffic and uptime)."""
        return {}

    def teardown(self) -> None:
        """Flush what must be flushed; sockets are closed afterwards."""

    def on_subscribe(self, port: str) -> None:
        """Someone subscribed to XPUB ``port`` (one call per loop turn however many did;
        e.g. publish the current parameters so a late subscriber need not wait)."""

    def on_peer_silent(self, name: str) -> None:
        """The peer of DEALER socket ``name`` said nothing for ``peer_timeout_s``, pings
        included (already logged and counted). Nodes that wait on it for a reply
        reconnect and resend here; the default only reports, because ZeroMQ reconnects
        by itself and a producer's credit comes back by itself (see Outbox)."""

    def _check_peers(self) -> None:
        now = time.monotonic()
        for name, heard in list(self._heard.items()):
            silent = now - heard
            if silent < self.heartbeat_s:
                continue
            try:  # a ping costs a few bytes; a full queue means the peer is not reading
                sockets.send(self.sockets[name], wire.encode(wire.PING), flags=zmq.NOBLOCK)
            except zmq.Again:
                pass
            if silent >= self.peer_timeout_s and name not in self._silent:
                self._silent.add(name)
                self.silent_peers += 1
                self.log.warning("peer on '%s' silent for %.1fs: declared dead", name, silent)
                self.on_peer_silent(name)

    # ----- the loop -----------------------------------------------------------------
    def run(self) -> int:
        # SIGHUP too: a closed terminal must stop a node cleanly, not kill it mid-write.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        if self._parent is not None:
            lifetime.die_with_parent()
        clean = False
        try:
            self._open_sockets()
            self.setup()
            if self.ctx.cores is not None:
                # Now: the sockets' I/O threads exist and stay on the shared cores.
                cores.pin_main_thread(self.ctx.cores)
                self.log.info("cores: %s", cores.describe(self.ctx.cores))
            self._report(wire.HELLO, kind=self.ctx.spec.kind or self.ctx.spec.impl,
                         role=self.role, shows=dict(self.shows),
                         node=self.ctx.spec.name, replica=self.ctx.replica,
                         incarnation=self.incarnation, pid=os.getpid(),
                         **({"secret": self._secret} if self._secret else {}))
            self.every(HEARTBEAT_S, lambda: self._report(wire.HEARTBEAT))
            if self._heard:
                # Peers' silence counts from now: a setup() longer than peer_timeout_s
                # (a model build on a loaded machine) is not their silence.
                now = time.monotonic()
                self._heard = dict.fromkeys(self._heard, now)
                self.every(self.heartbeat_s, self._check_peers)
            self.every(self.metrics_interval_s, self._emit_metrics)
            if self._parent is not None:
                self.every(PARENT_CHECK_S, self._check_parent)
            self.log.info("up (incarnation %s)", self.incarnation)
            while not self.stopping:
                ready = self._poller.poll(min(self.poll_timeout_ms(), MAX_POLL_MS))
                for sock, _ in ready:
                    if sock in self._xpub:
                        self._drain_subscriptions(sock)
                    else:
                        self._drain(sock)
                for port in self._subscribed:
                    self.on_subscribe(port)
                self._subscribed.clear()
                self.after_poll()
                self._fire_timers()
            self.teardown()
            self._emit_metrics()
            clean = True
        finally:
            self._metrics_log.close()
            self._board.close()
            self._status.stopped(clean)
            for sock in list(self.sockets.values()) + [self._supervisor]:
                if sock is not None:
                    sock.close()  # LINGER bounds how long this may wait
            if self._auth is not None:
                self._auth.stop()
            if self.ctx.supervisor is None:  # a node run alone: its run ends with it
                remove_ipc_dir(self.ctx.run_dir, tuple(
                    self.ctx.endpoints.bind_address(self.ctx.spec.name, port, self.ctx.replica)
                    for port in self.binds))
        self.log.info("stopped")
        return 0

    def _check_parent(self) -> None:
        if self._parent is not None and self._parent.gone() and not self.stopping:
            self.log.warning("the process that started us (pid %d) is gone; stopping",
                             self._parent.parent_pid)
            self.stopping = True

    def _drain_subscriptions(self, sock: zmq.Socket) -> None:
        """XPUB frames: ``\\x01topic`` subscribes, ``\\x00topic`` unsubscribes."""
        for _ in range(1000):
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if frame[:1] == b"\x01":
                self._subscribed.add(self._xpub[sock])

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.log.info("%s received, stopping", signal.Signals(signum).name)
        self.stopping = True

    def _drain(self, sock: zmq.Socket, limit: int = 1000) -> None:
        name, handler, is_router = self._handlers[sock]
        stats = self._traffic[name]
        for _ in range(limit):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            envelope, body = sockets.split_envelope(frames) if is_router else ([], frames)
            stats[0] += 1
            stats[1] += sum(len(f) for f in body)
            if name in self._heard:
                self._peer_heard(name)
            try:
                msg = wire.decode(body, self.max_message_bytes)
                if msg.type == wire.PING and envelope:
                    self._pong(name, envelope, msg)
                elif msg.type == wire.DESCRIBE and envelope:
                    self.send(name, wire.encode(wire.DESCRIPTION, **self.description(name)),
                              envelope)
                elif not envelope and name in self._outboxes and \
                        msg.type in (wire.CREDIT, wire.ERROR, wire.PONG):
                    self._outboxes[name].on_reply(msg)
                elif msg.type == wire.PONG and not envelope:
                    pass  # an answer to our liveness ping: hearing it was the point
                elif handler is None:
                    raise wire.ProtocolError(f"port '{name}' accepts only ping")
                else:
                    handler(envelope, msg)
            except wire.ProtocolError as exc:
                self.bad_messages += 1
                self.log_rejection(name, f"rejected message on '{name}': {exc}")
                if envelope:
                    self.send(name, wire.error_reply(str(exc)), envelope)
            if self.stopping or name in self._paused:
                return

    def _pong(self, name: str, envelope: list, ping: wire.Message) -> None:
        fields: dict[str, Any] = {"node": self.ctx.label, "incarnation": self.incarnation}
        seq = ping.fields.get("seq")
        if type(seq) is int:
            fields["seq"] = seq  # echoed: the pinger can tell which ping this answers
        self.send(name, wire.encode(wire.PONG, **fields), envelope)

    def description(self, port: str) -> dict[str, Any]:
        """What ``describe`` on ``port`` answers: enough for a client in any language
        to know what to send (protocol version, message types, env and its spaces)."""
        takes = self.accepts.get(port, ())
        out: dict[str, Any] = {
            "protocol": wire.PROTOCOL_VERSION, "node": self.ctx.label,
            "kind": self.ctx.spec.kind or self.ctx.spec.impl, "port": port,
            "accepts": [*takes, wire.PING, wire.DESCRIBE], "env": self.ctx.topo.env.get("id"),
        }
        out.update(self._env_description())
        return out

    def _env_description(self) -> dict[str, Any]:
        if self._env_fields is None:
            try:  # the loaded topology makes the env (gymnasium: only when someone asks)
                spec = self.ctx.topo.env_spec()
            except Exception as exc:  # noqa: BLE001  (an env that cannot be made here)
                self.log.warning("describe: cannot make env %s: %s",
                                 self.ctx.topo.env.get("id"), exc)
                self._env_fields = {}
                return self._env_fields
            action: dict[str, Any] = {"kind": "discrete", "n": spec.num_actions} \
                if spec.num_actions is not None else {
                    "kind": "box", "shape": list(spec.action_shape),
                    "low": spec.action_low.tolist(), "high": spec.action_high.tolist()}
            self._env_fields = {"obs_shape": list(spec.obs_shape),
                                "obs_dtype": spec.obs_dtype.name,
                                "action_dtype": spec.action_dtype.name, "action_space": action}
        return self._env_fields

    def _peer_heard(self, name: str) -> None:
        now = time.monotonic()
        if name in self._silent:
            self._silent.discard(name)
            self.log.info("peer on '%s' answers again after %.1fs", name,
                          now - self._heard[name])
        self._heard[name] = now

    def _fire_timers(self) -> None:
        now = time.monotonic()
        for timer in self._timers:
            if now >= timer[0]:
                timer[0] = now + timer[1]
                timer[2]()

    # ----- reporting ----------------------------------------------------------------
    def _report(self, msg_type: str, **fields: Any) -> None:
        if self._supervisor is None:
            return
        try:
            frames = wire.encode(msg_type, label=self.ctx.label, **fields)
            sockets.send(self._supervisor, frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # the supervisor is slow or gone; liveness is its problem, not ours
        except (wire.ProtocolError, ValueError, TypeError) as exc:
            # A report that cannot be encoded (too large, a bad field) is this node's
            # bug, not a reason to stop: a timer that raised would end the node.
            self.log.error("%s report not sent: %s", msg_type, exc)

    def _emit_metrics(self) -> None:
        now, cpu_s = time.monotonic(), time.process_time()
        dt = max(now - self._last_metrics_t, 1e-9)
        row: dict[str, Any] = {"time_s": round(now - self.started, 3)}
        row.update(self.metrics())
        links: dict[str, dict[str, Any]] = {}
        for name, stats in self._traffic.items():
            last = self._last_traffic.get(name, [0, 0, 0, 0])
            links[name] = {"role": "bind", "peer": self.binds[name]} if name in self.binds \
                else {"role": "link", "peer": self._target_of.get(name, "")}
            if stats[0] or stats[2]:
                row[f"{name}_msgs_per_s"] = round((stats[0] + stats[2] - last[0] - last[2]) / dt, 1)
                row[f"{name}_bytes_per_s"] = round((stats[1] + stats[3] - last[1] - last[3]) / dt)
                # each way apart too: which side of an edge is the bottleneck
                row[f"{name}_in_msgs_per_s"] = round((stats[0] - last[0]) / dt, 1)
                row[f"{name}_out_msgs_per_s"] = round((stats[2] - last[2]) / dt, 1)
                links[name].update(in_per_s=row[f"{name}_in_msgs_per_s"],
                                   out_per_s=row[f"{name}_out_msgs_per_s"],
                                   bytes_per_s=row[f"{name}_bytes_per_s"])
            self._last_traffic[name] = list(stats)
        row["bad_messages"] = self.bad_messages
        row["dropped"] = self.dropped
        # CPU of the whole process (ZeroMQ's I/O thread included) per second of wall
        # time, both taken at the start of this report and the last: 1.0 is a busy core;
        # a node well under it waits for its peers.
        row["cpu_cores"] = round((cpu_s - self._last_cpu_s) / dt, 3)
        self._last_cpu_s = cpu_s
        if self._heard:
            row["silent_peers"] = self.silent_peers
        if self._auth is not None:
            row["auth_denied"] = self._auth.denied  # CURVE handshakes refused by ZAP
        for name, outbox in self._outboxes.items():
            row[f"{name}_sent"] = outbox.sent  # cumulative: messages sent under credit
            row[f"{name}_recounts"] = outbox.recounts
            row[f"{name}_queue"] = len(outbox)  # messages waiting for credit
            if name in links:
                links[name]["queue"] = len(outbox)
        self._last_metrics_t = now
        self._metrics_log.write(row)
        self._board.write(row, self._traffic)
        self._status.write(row, links)
        cores.keep_others_off(self.ctx.cores)  # e.g. the status writer's thread, new
        returns, more = self.episode_log.take()
        self._report(wire.METRICS, row=row, episodes=returns,
                     **({"episodes_more": more} if more else {}))
