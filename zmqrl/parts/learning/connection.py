"""Noticing that a request/reply peer lost what we asked of it.

A learner waits on two servers (a replay, a parameter server) whose replies may come
late for good reasons: a replay in warm-up or held back by its rate limiter answers
pings (``pong``) but no ``sample`` for a while. Waiting is then right, and resending is
wrong (each resend piles up in the server's queue). Requests are lost only when the
server is gone, and that shows in one of two ways, neither a timer on the replies:

* the node runtime's liveness (``Node.on_peer_silent``): nothing, not even a pong, for
  ``network.peer_timeout_s`` (a hung process, a host or network gone);
* the connection dropped (ZeroMQ's socket monitor: ``EVENT_DISCONNECTED``): the
  process died or restarted, possibly so fast that its successor already answers
  pings. Whatever was in flight on the old connection is lost either way.

:class:`DisconnectWatch` reports the second; the caller then reopens its socket (a new
identity, so late replies to the old requests cannot arrive) and asks again.
"""

from __future__ import annotations

import uuid

import zmq
from zmq.utils.monitor import parse_monitor_message


class DisconnectWatch:
    """Watches one socket for dropped connections; :meth:`dropped` says whether any
    dropped since the last call. Re-:meth:`attach` after replacing the socket."""

    def __init__(self, sock: zmq.Socket):
        self._pair: zmq.Socket | None = None
        self._sock: zmq.Socket | None = None
        self.attach(sock)

    def attach(self, sock: zmq.Socket) -> None:
        self.close()
        address = f"inproc://zmqrl-monitor-{uuid.uuid4().hex}"
        sock.monitor(address, zmq.EVENT_DISCONNECTED)
        pair = sock.context.socket(zmq.PAIR)
        pair.setsockopt(zmq.LINGER, 0)
        pair.connect(address)
        self._sock, self._pair = sock, pair

    def dropped(self) -> bool:
        dropped = False
        while self._pair is not None:
            try:
                event = parse_monitor_message(self._pair.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
            dropped |= event["event"] == zmq.EVENT_DISCONNECTED
        return dropped

    def close(self) -> None:
        """Stop watching (before the watched socket is closed)."""
        if self._sock is not None and not self._sock.closed:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass
        if self._pair is not None:
            self._pair.close(linger=0)
        self._sock = self._pair = None
