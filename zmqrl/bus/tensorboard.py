"""TensorBoard scalars from the metrics rows nodes already make: one writer per node.

Every metrics row a node writes to its CSV (:mod:`zmqrl.bus.metrics`) is also written, as one
TensorBoard event, to ``<run_dir>/tb/<label>/``; the supervisor adds the run as a whole
as ``tb/run`` (:mod:`zmqrl.run.runmetrics`). So ``tensorboard --logdir runs/`` shows every
run and every node, and nothing is in TensorBoard that is not in a CSV column: the CSVs
stay the complete record, TensorBoard is a view of them (and optional).

Tags are named the way RL users know them (CleanRL's ``charts/`` and ``losses/``):

=====================  ===============================================================
``charts/*``           episodic_return (mean of the last 100), episodic_return_20,
                       episodic_length, sps (env steps/s), episodes, updates,
                       policy_lag, param_version, learning_rate
``losses/*``           a learner's loss terms (whatever its algorithm reports)
``edges/<link>/*``     per socket: msgs_per_s, in_msgs_per_s, out_msgs_per_s,
                       bytes_per_s, queue (messages waiting for credit), sent, recounts
``broker/*``           an inference broker's batch size, latency, pauses, actors
``replay/*``           a replay's size, fill, insert/sample rates, waits
``learner/*``          a learner's bookkeeping (queue, batches waiting, reconnects)
``node/*``             health: bad messages, dropped, silent peers, CURVE denials,
                       CPU in use (cores)
``<kind>/*``           anything else a node reports, under its kind
=====================  ===============================================================

The x axis (TensorBoard's *step*) is env steps where the node counts them (actors,
brokers, on-policy learners, parameter servers, ``tb/run``); a node that does not
(a replay, a replay-fed learner) uses its own progress count (``updates``, ``inserts``).

The writer is TensorBoard's own event-file writer with plain ``Summary`` protos: it needs
the ``tensorboard`` package (``pip install -e '.[tensorboard]'``) and never imports torch
(a remote actor runs without it; tensorboardX would import torch when it is installed).
One event per row costs about a millisecond every metrics interval, off the hot path;
the file is written by the writer's own thread. Without ``tensorboard`` installed, or
with ``ZMQRL_TENSORBOARD=0`` in the environment, nothing is written and nothing fails.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ENV_SWITCH = "ZMQRL_TENSORBOARD"  # "0" turns every writer off
FLUSH_S = 5.0  # the writer thread flushes this often (and on close)

CHARTS = {
    "return_mean_100": "episodic_return",
    "return_mean_20": "episodic_return_20",
    "length_mean_100": "episodic_length",
    "steps_per_s": "sps",
    "env_steps_per_s": "sps",
    "episodes": "episodes",
    "updates": "updates",
    "policy_lag": "policy_lag",
    "param_version": "param_version",
    "lr": "learning_rate",
}
HEALTH = frozenset({"bad_messages", "dropped", "silent_peers", "auth_denied", "cpu_cores"})
# Per-socket columns: "<socket>_<suffix>" (zmqrl.bus.node writes them).
EDGE_SUFFIXES = ("in_msgs_per_s", "out_msgs_per_s", "msgs_per_s", "bytes_per_s", "queue",
                 "sent", "recounts")
# A learner's columns that are not loss terms; every other column of a learner is.
LEARNER_BOOKKEEPING = frozenset({
    "queue", "batches_waiting", "batches_rejected", "replay_reconnects", "pending_grads",
    "server_version", "param_server_reconnects", "digest_updates", "length_mean_100",
})
KIND_PREFIX = {"inference_broker": "broker", "replay": "replay", "learner": "losses",
               "param_server": "param_server", "actor": "actor", "population": "population"}
NOT_SCALARS = frozenset({"time_s", "env_steps"})  # the axes, not curves
STEP_COLUMNS = ("env_steps", "updates", "inserts")


def enabled() -> bool:
    """Whether writers write: ``tensorboard`` is installed and not switched off."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    # Only whether it is there: importing it costs a second, paid by the first write.
    return importlib.util.find_spec("tensorboard") is not None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def tag_of(column: str, kind: str | None, links: Iterable[str] = ()) -> str | None:
    """The TensorBoard tag of metrics column ``column`` of a node of ``kind`` whose
    sockets are ``links``; None for the axes."""
    if column in NOT_SCALARS:
        return None
    for link in sorted(links, key=len, reverse=True):  # "experience_x" before "exp"
        if column.startswith(f"{link}_") and column[len(link) + 1:] in EDGE_SUFFIXES:
            return f"edges/{link}/{column[len(link) + 1:]}"
    if "/" in column:  # a column that names its own tag (the league's eval/..., population/...)
        return column
    if column in CHARTS:
        return f"charts/{CHARTS[column]}"
    if column in HEALTH:
        return f"node/{column}"
    if kind == "learner" and column in LEARNER_BOOKKEEPING:
        return f"learner/{column}"
    return f"{KIND_PREFIX.get(kind or '', kind or 'node')}/{column}"


def step_of(row: dict[str, Any]) -> int | None:
    """The row's x: env steps where the node counts them, else its own progress."""
    for column in STEP_COLUMNS:
        value = _number(row.get(column))
        if value is not None and value > 0:
            return int(value)
    return None


def scalars(row: dict[str, Any], kind: str | None,
            links: Iterable[str] = ()) -> dict[str, float]:
    """Every finite number of ``row`` under its tag (a NaN mean before the first episode,
    strings such as a digest, are left out)."""
    links = tuple(links)
    out: dict[str, float] = {}
    for column, value in row.items():
        number = _number(value)
        tag = tag_of(column, kind, links) if number is not None else None
        if tag is not None:
            out[tag] = number
    return out


class ScalarWriter:
    """One TensorBoard event file in ``logdir``, made when the first row comes."""

    def __init__(self, logdir: Path):
        self.logdir = Path(logdir)
        self._writer: Any = None
        self._failed = False
        self._last_step = 0

    def write(self, values: dict[str, float], step: int | None,
              wall_time: float | None = None) -> None:
        if self._failed or not values:
            return
        if self._writer is None and not self._open():
            return
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        if step is not None:  # a row without a count (none yet) stays at the last one
            # (an int64 in the event file: a count a peer inflated must not raise here)
            self._last_step = min(max(int(step), 0), 2**63 - 1)
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)
                                 for tag, value in values.items()])
        self._writer.add_event(Event(wall_time=wall_time or time.time(),
                                     step=self._last_step, summary=summary))

    def _open(self) -> bool:
        try:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self.logdir.mkdir(parents=True, exist_ok=True)
            self._writer = EventFileWriter(str(self.logdir), flush_secs=FLUSH_S)
        except (ImportError, OSError) as exc:
            self._failed = True  # once: the CSVs have everything anyway
            log.warning("no TensorBoard events in %s: %s", self.logdir, exc)
            return False
        return True

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class NodeBoard:
    """A node's writer: its metrics rows as TensorBoard scalars in ``tb/<label>``."""

    def __init__(self, run_dir: Path, label: str, kind: str | None):
        self.kind = kind
        self.writer = ScalarWriter(Path(run_dir) / "tb" / label) if enabled() else None

    def write(self, row: dict[str, Any], links: Iterable[str]) -> None:
        if self.writer is not None:
            self.writer.write(scalars(row, self.kind, links), step_of(row))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
