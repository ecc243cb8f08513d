"""Node classes for tests, swapped into topologies with ``impl:``: ones that misbehave on
purpose, and small ones that show what the runtime does (many-links)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar

import zmq

from nodes.actor import Actor
from zmqrl.bus import wire
from zmqrl.bus.node import Link, Node


class CrashingActor(Actor):
    def setup(self) -> None:
        raise RuntimeError("crashing on purpose")


class ManyFeeds(Node):
    """Subscribes to each target of its many-link ``feeds``; every message it hears is
    one line ``[index, fields]`` of ``<run_dir>/<label>.feeds.jsonl`` (for the test)."""

    links: ClassVar[dict[str, Link]] = {"feeds": Link("sub", many=True)}

    def setup(self) -> None:
        self.heard = open(self.ctx.run_dir / f"{self.ctx.label}.feeds.jsonl", "a")  # noqa: SIM115

    def on_feeds(self, index: int, _envelope: list, msg: wire.Message) -> None:
        self.heard.write(json.dumps([index, msg.fields]) + "\n")
        self.heard.flush()

    def teardown(self) -> None:
        self.heard.close()


@dataclass
class ManyRequestsArgs:
    send_to: list[int] = field(default_factory=list)  # indices of `out`'s targets
    every_s: float = 0.1


class ManyRequests(Node):
    """Sends ``get_params`` (with ``index``) every ``every_s`` on the sockets of its
    DEALER many-link ``out`` that ``send_to`` names, and none on the others."""

    links: ClassVar[dict[str, Link]] = {"out": Link("dealer", many=True)}
    Args: ClassVar[type] = ManyRequestsArgs
    metrics_interval_s: ClassVar[float] = 0.2  # the test reads the status file

    def setup(self) -> None:
        self.every(self.args.every_s, self._send)

    def _send(self) -> None:
        sockets = self.link_sockets("out")
        for i in self.args.send_to:
            self.send(sockets[i], wire.encode(wire.GET_PARAMS, index=i), flags=zmq.NOBLOCK)

    def on_out(self, index: int, _envelope: list, msg: wire.Message) -> None:
        self.log.info("reply on out_%d: %s", index, msg.type)
