"""A replay that no producer or peer can stop (issue 29, defects 1 and 7), as a real process.

* An insert too large for the rate limiter's window would wait for good, and while one
  waits the replay reads no other: the run stopped without a word. Now it is refused
  (an ``error`` naming the limit), its producer gets its credit back, and inserts and
  samples go on. ``zmqrl validate`` counts every producer's largest insert: an actor's
  ``insert_batch``, an MCTS actor's ``max_insert_positions`` and longest game, a
  ``command:`` node's ``args.largest_insert``.
* A ``sample`` naming the learner's ``client`` from another identity dropped the
  learner's waiting requests without a word: it waited for them forever. Now each
  dropped request is answered (``error`` with ``retry``) and the learner asks again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_replay_node import Replay, insert, topology, transitions

from zmqrl.bus import wire
from zmqrl.parts.replay import RateLimiter

from conftest import REPO, Client, wait_for


def test_an_insert_too_large_to_ever_fit_is_refused_and_the_replay_goes_on(processes,
                                                                             tmp_path):
    # Ape-X's limiter (samples_per_insert 4, error_buffer 2000): at most
    # (2 * 2000 - 8) / 4 = 998 items fit in one insert with batches of 8.
    replay = Replay(processes, tmp_path, topology(
        tmp_path, min_size=50, samples_per_insert=4.0, error_buffer=2000.0)).start()
    producer, learner = Client(replay.experience), Client(replay.sample)
    try:
        insert(producer, transitions(60))  # past min_size: the ratio applies
        reply = producer.request(transitions(2000, seed=1), timeout=60)
        assert reply.type == wire.ERROR, reply.type
        assert "an insert of 2000 items can never be admitted" in reply.fields["error"]
        assert "at most 998 fit in one insert" in reply.fields["error"]
        # The replay still reads inserts and serves samples.
        insert(producer, transitions(400, seed=2))  # fits: (460 x 4) - 0 <= 2200
        batch = learner.request(wire.encode(wire.SAMPLE, batch_size=8), timeout=30)
        assert batch.type == wire.BATCH and len(batch["key"]) == 8
        rows = wait_for(lambda: [r for r in replay.metrics()
                                 if r.get("refused_inserts") == "1"], 30,
                        "a metrics row counting the refused insert")
        assert rows[-1]["insert_waiting"] == "0"
        assert replay.proc.poll() is None
    finally:
        producer.close()
        learner.close()


def test_a_refused_message_gives_its_producer_its_credit_back():
    """Outbox: an ``error`` reply means the consumer is done with that message; without
    its credit back, two refusals would stop an actor for good."""
    from zmqrl.bus.node import Outbox

    class Node:  # what an Outbox needs of its node
        bad_messages = 0
        heartbeat_s = 1.0

        def __init__(self):
            self.sent: list = []
            import logging
            self.log = logging.getLogger("test-outbox")

        def register_outbox(self, _outbox):
            pass

        def send(self, _name, frames, flags=0):
            self.sent.append(frames)
            return True

        def log_rejection(self, _port, _line):
            pass

        def link_replicas(self, _name):
            return 1

    node = Node()
    outbox = Outbox(node, "experience", limit=8, credit=2)
    for i in range(4):
        outbox.push([str(i).encode()])
    assert len(node.sent) == 2  # the credit's worth
    for _ in range(2):
        outbox.on_reply(wire.decode(wire.error_reply("too large")))
    assert len(node.sent) == 4 and outbox.rejected == 2


def test_a_forged_client_costs_the_learner_a_round_trip_not_its_requests(processes,
                                                                           tmp_path):
    replay = Replay(processes, tmp_path, topology(tmp_path, min_size=10)).start()
    producer = Client(replay.experience)
    learner, forger = Client(replay.sample), Client(replay.sample)
    try:
        for client in (learner, forger):
            assert client.request(wire.encode(wire.PING), timeout=60).type == wire.PONG
        for _ in range(2):  # warm-up: they wait
            learner.send(wire.encode(wire.SAMPLE, batch_size=4, client="learner"))
        # a pong after them: they arrived (two sockets' messages have no order)
        assert learner.request(wire.encode(wire.PING), timeout=30).type == wire.PONG
        forger.send(wire.encode(wire.SAMPLE, batch_size=4, client="learner"))
        # The learner is told about each dropped request, so it can ask again.
        for _ in range(2):
            told = learner.recv(timeout=30)
            assert told.type == wire.ERROR and told.fields.get("retry") is True, told
        learner.send(wire.encode(wire.SAMPLE, batch_size=4, client="learner"))
        insert(producer, transitions(10))
        batch = learner.recv(timeout=30)
        assert batch.type == wire.BATCH and len(batch["key"]) == 4
    finally:
        for client in (producer, learner, forger):
            client.close()


def test_a_learner_asks_again_for_a_request_the_replay_dropped():
    """The learner's side: an ``error`` with ``retry`` answers the request (one fewer
    in flight, so the next poll asks again); it does not end the learner."""
    from collections import deque

    from zmqrl.parts.learning.sources import ReplayClient

    sent = []

    class Node:
        class ctx:  # noqa: N801
            label = "learner"

        def send(self, _link, frames, flags=0):
            sent.append(wire.decode(frames))
            return True

        def log_rejection(self, _port, _line):
            pass

    client = ReplayClient.__new__(ReplayClient)  # no socket: only the protocol
    client.node, client.batch_size, client.prefetch, client.link = Node(), 4, 2, "replay"
    client.batches, client.in_flight, client.dropped = deque(), 2, 0
    client.watch = type("Watch", (), {"dropped": staticmethod(lambda: False)})()
    client.on_message([], wire.decode(wire.encode(wire.ERROR, error="dropped", retry=True)))
    assert client.in_flight == 1 and client.dropped == 1
    client.poll()
    assert [m.type for m in sent] == [wire.SAMPLE] and client.in_flight == 2


def _validate(tmp_path: Path, name: str, edit) -> str:
    raw = yaml.safe_load((REPO / "topologies" / f"{name}.yaml").read_text())
    edit(raw)
    path = tmp_path / f"{name}-edited.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = subprocess.run([sys.executable, "-m", "zmqrl.cli", "validate", str(path)],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode != 0, result.stdout
    return result.stdout + result.stderr


def test_validate_counts_every_producers_largest_insert(tmp_path):
    # an actor's insert_batch: up to insert_batch - 1 held back, plus a step's items
    out = _validate(tmp_path, "apex", lambda raw: raw["nodes"]["actor"]["args"].update(
        insert_batch=1000))
    assert "can deadlock" in out, out
    # an MCTS actor's whole games: max_insert_positions - 1 and the longest game more
    out = _validate(tmp_path, "alphazero", lambda raw: raw["nodes"]["actor"]["args"].update(
        max_insert_positions=1000))
    assert "can deadlock" in out, out

    def command_producer(raw):
        raw["nodes"]["external"] = {"command": ["python", "-c", "pass"],
                                    "links": {"experience": "replay.experience"}}
    out = _validate(tmp_path, "apex", command_producer)
    assert "cannot tell the largest insert" in out and "args.largest_insert" in out, out


def test_largest_fitting_insert_solves_the_deadlock_rule():
    limiter = RateLimiter(1000, 4.0, 2000.0)
    largest = limiter.largest_fitting_insert(64)
    assert largest == (2 * 2000 - 64) // 4
    limiter.check_batch(64, largest)  # fits
    with pytest.raises(ValueError, match="deadlock"):
        limiter.check_batch(64, largest + 1)
    assert RateLimiter(10).largest_fitting_insert(64) is None  # no ratio: any size


def test_no_sample_request_changes_what_inserts_are_admitted(processes, tmp_path):
    """A foreign sample as large as the capacity sized the largest insert admitted:
    after it, even a 1-item insert was refused, for good. Now such a sample is refused
    itself (it could never be served beside the inserts taken), and inserts go on."""
    replay = Replay(processes, tmp_path, topology(
        tmp_path, capacity=50000, min_size=50, samples_per_insert=4.0,
        error_buffer=2000.0)).start()
    producer, forger = Client(replay.experience), Client(replay.sample)
    try:
        insert(producer, transitions(60))
        reply = forger.request(wire.encode(wire.SAMPLE, batch_size=4000), timeout=60)
        assert reply.type == wire.ERROR and "sample refused" in reply.fields["error"], reply
        insert(producer, transitions(1, seed=3))  # a 1-item insert still goes in
        insert(producer, transitions(12, seed=4))
    finally:
        producer.close()
        forger.close()
