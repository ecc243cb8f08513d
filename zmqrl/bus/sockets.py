"""The only place sockets are made and their options set.

Nodes never call ``zmq.Context.socket`` or ``setsockopt`` themselves: every socket
gets bounded queues (HWM), a per-frame size cap, a bounded linger and reconnect
back-off from here, so that no socket in the system can grow without bound or hang
shutdown. When the topology configures CURVE, sockets on tcp endpoints also get their
keys here (:mod:`zmqrl.bus.security`); ipc endpoints stay plain.
"""

from __future__ import annotations

from dataclasses import dataclass

import zmq

from zmqrl.bus import security, wire

BIND_TYPES = {
    "router": zmq.ROUTER,
    "pub": zmq.PUB,
    "pull": zmq.PULL,
}
CONNECT_TYPES = {
    "dealer": zmq.DEALER,
    "sub": zmq.SUB,
    "push": zmq.PUSH,
}


# Frames at least this large are sent zero-copy (pyzmq's own default threshold).
_ZERO_COPY_MIN_BYTES = 65536


@dataclass(frozen=True, slots=True)
class SocketOptions:
    hwm: int = 1000  # messages queued per peer before sends block/drop
    linger_ms: int = 500  # how long close() may wait to flush
    max_frame_bytes: int = wire.MAX_MESSAGE_BYTES
    reconnect_ms: int = 100
    reconnect_max_ms: int = 2000
    # Queue only on completed connections: a producer whose consumer is not up yet
    # gets EAGAIN instead of filling a queue with data that will be stale on arrival.
    immediate: bool = False
    # CURVE keys for tcp endpoints (None: plain tcp). ipc endpoints ignore them.
    curve: security.CurveKeys | None = None
    # Bind a "pub" port as an XPUB: a PUB to every subscriber, which also hands the node
    # each new subscription (XPUB_VERBOSE: every one, not only the first per topic), so
    # it can answer a late joiner at once (the learner sends it the current params).
    xpub: bool = False


def _configure(sock: zmq.Socket, opts: SocketOptions) -> None:
    sock.setsockopt(zmq.LINGER, opts.linger_ms)
    sock.setsockopt(zmq.SNDHWM, opts.hwm)
    sock.setsockopt(zmq.RCVHWM, opts.hwm)
    sock.setsockopt(zmq.MAXMSGSIZE, opts.max_frame_bytes)
    sock.setsockopt(zmq.RECONNECT_IVL, opts.reconnect_ms)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, opts.reconnect_max_ms)
    if opts.immediate:
        sock.setsockopt(zmq.IMMEDIATE, 1)
    if sock.type == zmq.ROUTER:
        # A reply to a peer that has gone raises EHOSTUNREACH instead of vanishing,
        # so the node can count it.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if sock.type == zmq.XPUB:
        sock.setsockopt(zmq.XPUB_VERBOSE, 1)
    if sock.type == zmq.SUB:
        sock.setsockopt(zmq.SUBSCRIBE, b"")


def bind(ctx: zmq.Context, kind: str, address: str, opts: SocketOptions) -> zmq.Socket:
    sock = ctx.socket(zmq.XPUB if kind == "pub" and opts.xpub else BIND_TYPES[kind])
    _configure(sock, opts)
    if opts.curve is not None and security.is_tcp(address):
        security.make_server(sock, opts.curve)  # before bind: the mechanism is per socket
    sock.bind(address)
    return sock


def connect(
    ctx: zmq.Context, kind: str, addresses: list[str], opts: SocketOptions
) -> zmq.Socket:
    sock = ctx.socket(CONNECT_TYPES[kind])
    _configure(sock, opts)
    tcp = [security.is_tcp(a) for a in addresses]
    if opts.curve is not None and any(tcp):
        # One mechanism per socket: a link's addresses are one node's replicas, all
        # tcp or all ipc, so this cannot happen from a topology.
        if not all(tcp):
            sock.close(linger=0)
            raise ValueError(f"cannot mix tcp and ipc endpoints under CURVE: {addresses}")
        security.make_client(sock, opts.curve)
    for address in addresses:
        if opts.curve is not None and security.is_tcp(address):
            # Read at connect: each address may have a server key of its own.
            sock.curve_serverkey = opts.curve.server_key_for(address)
        sock.connect(address)
    return sock


def send(sock: zmq.Socket, frames: list, identity: list | None = None, flags: int = 0) -> None:
    """Send one encoded message; ``identity`` is a ROUTER envelope to prepend."""
    if identity:
        frames = identity + frames
    # Large buffers go zero-copy; pyzmq copies anything under its copy threshold anyway.
    copy = all(memoryview(f).nbytes < _ZERO_COPY_MIN_BYTES for f in frames)
    sock.send_multipart(frames, flags=flags, copy=copy)


def split_envelope(frames: list) -> tuple[list, list]:
    """Split a message received on a ROUTER into (envelope, body).

    A DEALER peer's message is ``[identity, body...]``; a REQ peer adds an empty
    delimiter, ``[identity, b"", body...]``, which must come back with the reply. An
    empty frame is a delimiter only if a body follows it: a lone empty frame is the
    (empty, rejected) body itself, so its ``error`` reply is one frame, as it was sent.
    """
    if len(frames) >= 3 and len(frames[1]) == 0:
        return frames[:2], frames[2:]
    return frames[:1], frames[1:]
