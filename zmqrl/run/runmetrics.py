"""The run as a whole, from what the nodes report to the supervisor.

Nodes send ``hello``, ``heartbeat`` and ``metrics`` to the supervisor's ROUTER. None of
it is trusted: every field is type-checked (a bad one raises ``wire.ProtocolError``, one
log line, never a crash). The supervisor hands each process it starts a random secret of
its own (``ZMQRL_NODE_SECRET`` in its environment, new for every start; a process it
starts inherits it, so a ``command:`` node's ``zmqrl node`` child has it too). A hello
for a label is believed only with that label's current secret, and binds the label to
the ROUTER identity that said it: heartbeats and metrics for the label count only from
that identity, and no other peer can take the label over. A pid proves nothing (another
host's pids, or a guessed one); knowing a label and its node's pid is not enough to
report steps or returns for an actor and stop the run with ``--max-steps`` or
``--target-return``. A node started by hand against a running supervisor has no secret:
its own reports are refused, and what it does counts through the nodes it talks to (a
broker counts every connection it serves).

Env steps are counted by the role each node says in its hello (:mod:`zmqrl.bus.roles`),
never by its kind, from several views, each a lower bound of the truth and free of
double counting: the acting nodes' own counts; the serving nodes' counts (every
connection they serve, actors the supervisor did not start included) plus those of the
acting nodes that no serving node acts for (local policies); the learners' (every unroll
they took in, restored with their checkpoint) and the parameter servers'. The run's
total is the largest view. A node that restarts counts from 0 again; its earlier count
is carried.

Each second the supervisor also writes the run's row as TensorBoard scalars (``tb/run``,
x = the run's env steps; :mod:`zmqrl.bus.tensorboard`) and what it knows of its processes
(started, waiting to restart, failed) to ``status/_supervisor.json`` (:mod:`zmqrl.bus.status`).
"""

from __future__ import annotations

import csv
import hmac
import math
import secrets
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zmqrl.bus import messages, roles, status, wire
from zmqrl.bus import tensorboard as tb
from zmqrl.bus.metrics import CsvLog
from zmqrl.run import surgery
from zmqrl.run.topology import Topology, load_class

MAX_ROW_FIELDS = 1000
MAX_EPISODES_PER_REPORT = 100_000
_SCALARS = (int, float, str, bool, type(None))
_NO_ENV = messages.Context()  # supervisor messages carry no arrays


@dataclass
class StopConditions:
    max_steps: int | None = None
    max_seconds: float | None = None
    target_return: float | None = None
    window: int = 100
    # seconds after the first env step was reported: start-up (imports, first
    # connections) does not count, however long a loaded machine makes it. Last, so
    # that positional callers (the CLI) keep their meaning.
    max_stepping_seconds: float | None = None


@dataclass
class _Peer:
    """What the supervisor knows of one node replica it started."""

    node: str
    kind: str | None  # for display: the node's kind, impl or command
    pid: int | None = None  # the process started for it
    role: str = roles.NONE  # said in its hello (zmqrl.bus.roles): what it is counted for
    shows: dict[str, str] = field(default_factory=dict)  # row fields for the progress line
    identity: bytes | None = None  # ROUTER identity of the peer whose hello we accepted
    secret: str | None = field(default=None, repr=False)  # handed to its current process
    steps: int = 0  # env steps reported by the current process
    carried: int = 0  # env steps of its earlier processes (it restarted)
    row: dict[str, Any] = field(default_factory=dict)
    starts: int = 0  # processes started for it
    state: str = "running"  # running | restarting | failed | finished
    exit_code: int | None = None


def _field(msg: wire.Message, name: str, kind: type) -> Any:
    value = msg.fields.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise wire.ProtocolError(f"'{msg.type}' field '{name}' must be {kind.__name__}, "
                                 f"got {value!r:.60}")
    return value


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value)


def new_secret() -> str:
    """A node process's secret (the supervisor's, for one start of one label)."""
    return secrets.token_hex(16)


def _same_secret(given: Any, expected: str | None) -> bool:
    return isinstance(given, str) and expected is not None and hmac.compare_digest(
        given.encode("utf-8", "replace"), expected.encode())


class RunMetrics:
    """Checks and pools the nodes' reports; the run's totals and stop conditions."""

    def __init__(self, topo: Topology, stop: StopConditions, run_dir: Path,
                 resume: bool = False):
        self.topo = topo
        self.stop = stop
        self.run_dir = Path(run_dir)
        self.peers: dict[str, _Peer] = {}
        # the last 100 episodes' returns (the progress line's, run.csv's), or the
        # target's window where it is longer
        self.returns: deque[float] = deque(maxlen=max(100, stop.window))
        self.episodes = 0
        self.learner_row: dict[str, Any] = {}
        self.stepping_since: float | None = None  # elapsed s at the first env step seen
        self.rejected = 0  # reports refused (bad fields, unknown or spoofed labels)
        self.run_log: CsvLog | None = None
        self.board = tb.ScalarWriter(self.run_dir / "tb" / "run") if tb.enabled() else None
        self._last_row: tuple[float, int] | None = None  # (time_s, env steps) logged last
        # A resumed run carries on the totals of metrics/run.csv (its last row): time,
        # env steps (the nodes count from 0 again, except a learner) and episodes; the
        # updates stand at the last row's until the restored learner reports.
        self.base_time_s, self.base_env_steps, self.base_episodes = 0.0, 0, 0
        self.base_updates = 0
        # a surgery done before this resume (zmqrl.run.surgery), not yet marked on a row
        self.surgery: int | None = None
        if resume:
            self._load_base()
        # Each node's role as its class declares it (a command node: from its hello),
        # so an acting node's link to a serving one is known before either says hello.
        self.node_roles: dict[str, str] = {}
        for name, spec in topo.nodes.items():
            if spec.target is not None:
                try:
                    self.node_roles[name] = getattr(load_class(spec.target), "role",
                                                    roles.NONE)
                except (ImportError, AttributeError):
                    pass  # the topology check reports it

    def _load_base(self) -> None:
        path = self.run_dir / "metrics" / "run.csv"
        rows = []
        if path.exists():
            with open(path, newline="") as f:
                rows = list(csv.DictReader(f))
        marked = max((int(r["surgery"]) for r in rows if r.get("surgery")), default=0)
        if surgery.surgeries(self.run_dir) > marked:
            self.surgery = surgery.surgeries(self.run_dir)
        if rows:
            last = rows[-1]
            self.base_time_s = float(last.get("time_s") or 0)
            self.base_env_steps = int(float(last.get("env_steps") or 0))
            self.base_episodes = int(float(last.get("episodes") or 0))
            self.base_updates = int(float(last.get("updates") or 0))

    # ----- the processes the supervisor runs ------------------------------------------
    def started(self, label: str, node: str, pid: int, secret: str) -> None:
        """The supervisor started ``pid`` for ``label`` and handed it ``secret``
        (:func:`new_secret`): only a hello with that secret is believed."""
        spec = self.topo.nodes[node]
        shown = spec.kind or spec.impl or " ".join(spec.command or [])[:60]
        peer = self.peers.setdefault(label, _Peer(node, shown))
        peer.pid = pid
        peer.identity = None
        peer.secret = secret
        peer.carried += peer.steps
        peer.steps = 0
        peer.starts += 1
        peer.state, peer.exit_code = "running", None

    def exited(self, label: str, code: int, restarting: bool) -> None:
        """The process of ``label`` exited with ``code``; the supervisor starts it again
        (``restarting``) or not (failed for a non-zero code, else finished)."""
        peer = self.peers.get(label)
        if peer is not None:
            peer.exit_code = code
            peer.state = "restarting" if restarting else "failed" if code else "finished"

    # ----- reports --------------------------------------------------------------------
    def handle(self, identity: bytes, msg: wire.Message) -> str:
        """Take one report from the peer ``identity``; returns its label. Raises
        ``wire.ProtocolError`` for anything not to be believed."""
        if msg.type not in (wire.HELLO, wire.HEARTBEAT, wire.METRICS):
            raise wire.ProtocolError(f"the supervisor takes no '{msg.type:.40}'")
        label = _field(msg, "label", str)
        messages.check(msg, messages.spec(msg.type), _NO_ENV)  # the declared fields
        peer = self.peers.get(label)
        if peer is None:
            raise wire.ProtocolError(f"'{label:.60}' is not a node this supervisor started")
        if msg.type == wire.HELLO:
            if not _same_secret(msg.fields.get("secret"), peer.secret):
                raise wire.ProtocolError(f"hello as '{label}' without the secret the "
                                         "supervisor gave its process")
            if peer.identity is not None and peer.identity != identity:
                raise wire.ProtocolError(f"hello as '{label}' from a second peer: the "
                                         "label is bound to the first")
            role = msg.fields.get("role", roles.NONE)
            if role not in roles.ROLES:
                raise wire.ProtocolError(f"hello as '{label}' with role {role!r:.40}: not one "
                                         f"of {', '.join(repr(r) for r in roles.ROLES)}")
            peer.identity, peer.role = identity, role
            peer.shows = dict(msg.fields.get("shows") or {})
            self.node_roles[peer.node] = role
            return label
        if peer.identity != identity:
            raise wire.ProtocolError(f"'{msg.type}' as '{label}' from a peer that did not "
                                     "say hello as it")
        if msg.type == wire.METRICS:
            self._metrics(peer, msg)
        return label

    def _metrics(self, peer: _Peer, msg: wire.Message) -> None:
        row = msg.fields.get("row", {})
        if not isinstance(row, dict) or len(row) > MAX_ROW_FIELDS or not all(
                isinstance(k, str) and isinstance(v, _SCALARS) for k, v in row.items()):
            raise wire.ProtocolError("metrics 'row' must map names to scalars")
        episodes = msg.fields.get("episodes", [])
        if not isinstance(episodes, list) or len(episodes) > MAX_EPISODES_PER_REPORT \
                or not all(map(_finite, episodes)):
            raise wire.ProtocolError("metrics 'episodes' must be a list of finite numbers")
        steps = row.get("env_steps")
        if steps is not None and not (_finite(steps) and steps >= 0):
            raise wire.ProtocolError(f"metrics 'env_steps' must be a number >= 0, "
                                     f"got {steps!r:.60}")
        self.returns.extend(episodes)
        self.episodes += len(episodes) + msg.fields.get("episodes_more", 0)
        if steps is not None:
            if peer.role == roles.LEARNS:
                peer.steps = int(steps)  # restored with its checkpoint: never carried
            elif steps < peer.steps:  # restarted without us seeing it: carry the old count
                peer.carried += peer.steps
                peer.steps = int(steps)
            else:
                peer.steps = int(steps)
        peer.row = row
        if peer.role == roles.LEARNS:
            self.learner_row = row

    # ----- totals ---------------------------------------------------------------------
    def _sum(self, role: str, nodes: set[str] | None = None) -> int:
        return sum(p.carried + p.steps for p in self.peers.values()
                   if p.role == role and (nodes is None or p.node in nodes))

    def _served_by_none(self) -> set[str]:
        """Acting nodes with no link to a serving node: they act with their own policy,
        so no serving node's count includes their steps."""
        return {name for name, spec in self.topo.nodes.items()
                if self.node_roles.get(name) == roles.ACTS and not any(
                    self.node_roles.get(target.split(".")[0]) == roles.SERVES
                    for target in spec.all_targets())}

    @property
    def total_env_steps(self) -> int:
        actors = self._sum(roles.ACTS)
        served = self._sum(roles.SERVES) + self._sum(roles.ACTS, self._served_by_none())
        this_run = self.base_env_steps + max(actors, served, self._sum(roles.APPLIES))
        # the learners' own counts already include the earlier runs (checkpoint)
        return max(this_run, sum(p.steps for p in self.peers.values()
                                 if p.role == roles.LEARNS))

    def shown(self) -> dict[str, float]:
        """The fields nodes asked the progress line to show (their hello's ``shows``),
        pooled over the nodes that report them: summed, or the latest report's."""
        out: dict[str, float] = {}
        for peer in self.peers.values():
            for name, pooling in peer.shows.items():
                value = peer.row.get(name)
                if not _finite(value):
                    continue
                out[name] = out.get(name, 0.0) + value if pooling == "sum" else value
        return out

    def mean_return(self, last: int = 100) -> float:
        """The mean return of the last ``last`` episodes (of those there are)."""
        values = list(self.returns)[-last:]
        return sum(values) / len(values) if values else math.nan

    def target_reached(self) -> bool:
        """Whether --target-return is reached over the last --target-window episodes."""
        s = self.stop
        return s.target_return is not None and len(self.returns) >= s.window \
            and self.mean_return(s.window) >= s.target_return

    def stop_reason(self, elapsed_s: float) -> str | None:
        s = self.stop
        if s.max_seconds is not None and elapsed_s >= s.max_seconds:
            return f"--max-seconds {s.max_seconds:g} reached"
        if self.stepping_since is None and self.total_env_steps > 0:
            self.stepping_since = elapsed_s
        if (s.max_stepping_seconds is not None and self.stepping_since is not None
                and elapsed_s - self.stepping_since >= s.max_stepping_seconds):
            return f"{s.max_stepping_seconds:g} s of stepping reached"
        if s.max_steps is not None and self.total_env_steps >= s.max_steps:
            return f"--max-steps {s.max_steps} reached"
        if self.target_reached():
            return (f"target return {s.target_return:g} reached: mean of the last "
                    f"{s.window} episodes {self.mean_return(s.window):.1f}")
        return None

    def log_row(self, elapsed_s: float) -> None:
        """One row a second of the run as a whole (``metrics/run.csv``): what learning
        curves are drawn from."""
        if self.run_log is None:
            self.run_log = CsvLog(self.run_dir / "metrics" / "run.csv")
        row = {
            "time_s": round(self.base_time_s + elapsed_s, 2),
            "env_steps": self.total_env_steps, "episodes": self.base_episodes + self.episodes,
            "return_mean_20": round(self.mean_return(20), 2),
            "return_mean_100": round(self.mean_return(), 2),
            "updates": self.learner_row.get("updates", self.base_updates)
            if self.learner_row else self.base_updates,
        }
        if self.surgery is not None:  # the first row after a surgery says which
            row["surgery"], self.surgery = self.surgery, None
        self.run_log.write(row)
        self._log_board(row)
        status.write_supervisor(self.run_dir, {
            label: {"node": p.node, "kind": p.kind, "role": p.role, "pid": p.pid,
                    "starts": p.starts,
                    "state": p.state, "exit_code": p.exit_code}
            for label, p in self.peers.items()})

    def _log_board(self, row: dict[str, Any]) -> None:
        """The run's row in TensorBoard (``tb/run``), with its env steps/s."""
        if self.board is None:
            return
        values = tb.scalars(row, "run")
        if self._last_row is not None and row["time_s"] > self._last_row[0]:
            values["charts/sps"] = (row["env_steps"] - self._last_row[1]) / \
                (row["time_s"] - self._last_row[0])
        self._last_row = (row["time_s"], row["env_steps"])
        self.board.write(values, row["env_steps"])

    def close(self) -> None:
        """Flush and close the run's files (the supervisor's last call)."""
        if self.run_log is not None:
            self.run_log.close()
        if self.board is not None:
            self.board.close()
