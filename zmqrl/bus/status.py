"""``zmqrl status``: every node of a run, from the small status files in its run directory.

**Writing.** Each node replaces ``<run_dir>/status/<label>.json`` every metrics interval
(:class:`NodeStatus`, called from the node runtime's metrics path): pid, host,
incarnation, starts and restarts, its sockets with their peers and rates, and its last
metrics row. The supervisor of ``zmqrl up`` adds ``status/_supervisor.json`` (what it
knows and a node cannot say: a node is waiting to be restarted, or failed for good;
:mod:`zmqrl.run.runmetrics`). Files are written beside and renamed over, so a reader never
sees half of one. A node writes from a thread of its own: a rename can cost milliseconds
(ext4 flushes the data of a replaced file), which its loop should not wait for.

Why files and not the CSV tails: a CSV row has no pid, host, incarnation or peers, and
its header can be rewritten under a reader; a JSON snapshot is self-describing and one
small read. Why the nodes write it and not only the supervisor: runs started by honcho
from the Procfile (or any other engine) have no supervisor, and every node of those
still writes its file; whatever shares the run directory sees the run.

**Reading.** :func:`snapshot` turns the files into one :class:`NodeView` per replica the
run's ``topology.yaml`` names (plus any other file found), with a state:

=============  =====================================================================
``alive``      reported within the last few metrics intervals
``silent``     its process lives (or is on another host) but reports stopped coming
``restarting`` it exited and the supervisor will start it again
``failed``     the supervisor gave up on it (or it crashed and nothing restarts it)
``down``       it crashed and no supervisor says what comes next (a watchdog may)
``stopped``    it stopped cleanly (the run is over, or it finished)
``starting``   no report yet
=============  =====================================================================

:func:`render` makes the rich table; ``zmqrl status`` refreshes it every second.
"""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

STATUS_DIR = "status"
SUPERVISOR_FILE = "_supervisor.json"
SILENT_AFTER_INTERVALS = 3.0  # no report for this many metrics intervals: silent
SILENT_AFTER_MIN_S = 5.0
SUPERVISOR_STALE_S = 5.0  # it writes every second


def _write_text(path: Path, text: str) -> None:
    """Write beside and rename over: a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def pid_alive(pid: Any) -> bool:
    """Whether process ``pid`` exists (someone else's counts)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return True


# ----- writing (a node) ---------------------------------------------------------------
class NodeStatus:
    """One node replica's ``status/<label>.json``.

    ``starts`` counts the processes that ran as this label in this run directory;
    ``restarts`` those that followed one that did not stop cleanly (a resumed run is a
    new start, not a restart).
    """

    def __init__(self, run_dir: Path, label: str, node: str, replica: int,
                 kind: str | None, incarnation: str, interval_s: float,
                 topology: str = "", env: str = ""):
        self.path = Path(run_dir) / STATUS_DIR / f"{label}.json"
        self.data: dict[str, Any] = {
            "label": label, "node": node, "replica": replica, "kind": kind,
            "pid": os.getpid(), "host": socket.gethostname(), "incarnation": incarnation,
            "started_at": time.time(), "interval_s": interval_s, "state": "running",
            "starts": 1, "restarts": 0, "topology": topology, "env": env,
        }
        earlier = _read_json(self.path)
        if earlier and earlier.get("incarnation") != incarnation:
            self.data["starts"] = int(earlier.get("starts", 0)) + 1
            crashed = earlier.get("state") != "stopped"
            self.data["restarts"] = int(earlier.get("restarts", 0)) + int(crashed)
        self._mark: tuple[float, float] | None = None  # (time, env steps) of the last row
        self._failed = False
        self._writer: ThreadPoolExecutor | None = None
        self._pending: Future | None = None

    def write(self, row: dict[str, Any], links: dict[str, dict[str, Any]]) -> None:
        """The latest metrics ``row`` and per-socket ``links`` (role, peer, rates)."""
        now = time.monotonic()
        steps = row.get("env_steps")
        if isinstance(steps, int | float) and not isinstance(steps, bool):
            if self._mark is not None and now > self._mark[0]:
                self.data["env_steps_per_s"] = round(
                    max(0.0, steps - self._mark[1]) / (now - self._mark[0]), 1)
            self._mark = (now, float(steps))
        self.data.update(updated_at=time.time(), row=row, links=links)
        if self._pending is not None and not self._pending.done():
            return  # the disk is slower than our interval: the next row will do
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="status")
        self._pending = self._writer.submit(self._save, json.dumps(self.data, default=str))

    def stopped(self, clean: bool) -> None:
        """The process ends: ``stopped`` after a clean stop, ``crashed`` otherwise
        (written before this returns)."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        self.data.update(updated_at=time.time(), state="stopped" if clean else "crashed")
        self._save(json.dumps(self.data, default=str))

    def _save(self, text: str) -> None:
        if self._failed:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _write_text(self.path, text)
        except OSError:
            self._failed = True  # a read-only or full disk must not stop the node


def write_supervisor(run_dir: Path, nodes: dict[str, dict[str, Any]]) -> None:
    """The supervisor's view of its processes, in ``status/_supervisor.json``."""
    path = Path(run_dir) / STATUS_DIR / SUPERVISOR_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_text(path, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                      "updated_at": time.time(), "nodes": nodes}))
    except OSError:
        pass


# ----- reading ------------------------------------------------------------------------
@dataclass
class LinkView:
    name: str
    role: str  # "bind" or "link"
    peer: str  # the port a link connects to; the socket kind of a bound port
    in_per_s: float | None = None
    out_per_s: float | None = None
    bytes_per_s: float | None = None
    queue: int | None = None


@dataclass
class NodeView:
    label: str
    kind: str = ""
    state: str = "starting"
    pid: int | None = None
    host: str = ""
    incarnation: str = ""
    restarts: int = 0
    age_s: float | None = None  # since the last report
    env_steps: float | None = None
    env_steps_per_s: float | None = None
    batch: str = ""  # an inference broker's envs per forward pass (and fill)
    policy_lag: float | None = None
    links: list[LinkView] = field(default_factory=list)
    row: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunView:
    run_dir: Path
    name: str
    supervisor: str  # "pid N", "gone", or "none" (honcho, another engine)
    env_steps: int | None = None
    return_mean_100: float | None = None
    time_s: float | None = None
    nodes: list[NodeView] = field(default_factory=list)


def _expected(topo: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, node, kind) of every replica the topology names, in its order."""
    out = []
    for name, spec in (topo.get("nodes") or {}).items():
        spec = spec or {}
        replicas = int(spec.get("replicas", 1) or 1)
        kind = spec.get("kind") or ("command" if spec.get("command") else spec.get("impl", ""))
        for r in range(replicas):
            out.append((name if replicas == 1 else f"{name}.{r}", name, str(kind)))
    return out


def _actor_envs(topo: dict[str, Any], broker: str) -> int | None:
    """How many envs the actors linked to ``broker`` step in all (for its batch fill)."""
    total = 0
    for spec in (topo.get("nodes") or {}).values():
        spec = spec or {}
        targets = [t for given in (spec.get("links") or {}).values()
                   for t in (given if isinstance(given, list) else [given])]  # many-links
        if any(str(t).split(".")[0] == broker for t in targets):
            envs = (spec.get("args") or {}).get("envs")
            if not isinstance(envs, int):
                return None
            total += envs * int(spec.get("replicas", 1) or 1)
    return total or None


def _last_row(path: Path) -> dict[str, str] | None:
    """The last row of a CSV, reading only its header and its tail."""
    try:
        with open(path, "rb") as f:
            header = f.readline().decode()
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4096))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    if len(lines) < 2:
        return None
    rows = list(csv.DictReader(io.StringIO(header + lines[-1] + "\n")))
    return rows[0] if rows else None


def _float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if number != number else number  # NaN: nothing yet


def _links(data: dict[str, Any]) -> list[LinkView]:
    out = []
    for name, info in sorted((data.get("links") or {}).items(),
                             key=lambda kv: (kv[1].get("role") != "bind", kv[0])):
        out.append(LinkView(name, str(info.get("role", "")), str(info.get("peer") or ""),
                            _float(info.get("in_per_s")), _float(info.get("out_per_s")),
                            _float(info.get("bytes_per_s")),
                            int(info["queue"]) if isinstance(info.get("queue"), int) else None))
    return out


def snapshot(run_dir: Path, now: float | None = None) -> RunView:
    """The run in ``run_dir`` as it is now, from its files."""
    run_dir = Path(run_dir)
    now = time.time() if now is None else now
    here = socket.gethostname()
    topo: dict[str, Any] = {}
    try:
        topo = yaml.safe_load((run_dir / "topology.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        pass
    status_dir = run_dir / STATUS_DIR
    sup = _read_json(status_dir / SUPERVISOR_FILE)
    sup_live = bool(sup) and pid_alive(sup.get("pid")) and sup.get("host") == here \
        and now - float(sup.get("updated_at", 0)) < SUPERVISOR_STALE_S
    supervisor = "none" if not sup else (f"pid {sup.get('pid')}" if sup_live else "gone")
    sup_nodes = (sup or {}).get("nodes") or {}
    files = {p.stem: p for p in sorted(status_dir.glob("*.json"))
             if p.name != SUPERVISOR_FILE} if status_dir.is_dir() else {}
    expected = _expected(topo)
    labels = [label for label, _, _ in expected] + [s for s in files
                                                      if s not in {e[0] for e in expected}]
    kinds = {label: kind for label, _, kind in expected}
    named = next((d.get("topology") for p in files.values()
                  if (d := _read_json(p)) and d.get("topology")), None) if not topo else None
    view = RunView(run_dir, str(topo.get("name") or named or run_dir.name), supervisor)
    last = _last_row(run_dir / "metrics" / "run.csv")
    if last:
        view.env_steps = int(_float(last.get("env_steps")) or 0)
        view.return_mean_100 = _float(last.get("return_mean_100"))
        view.time_s = _float(last.get("time_s"))
    for label in labels:
        data = _read_json(files[label]) if label in files else None
        node = NodeView(label, kind=kinds.get(label, ""))
        view.nodes.append(node)
        sup_node = sup_nodes.get(label) or {}
        if sup_node:
            node.restarts = max(0, int(sup_node.get("starts", 1)) - 1)
            node.pid = sup_node.get("pid")
        if data:
            _fill(node, data, topo, now)
        node.state = _state(node, data, sup_node if sup_live else {}, sup_live, here, now)
    return view


def _fill(node: NodeView, data: dict[str, Any], topo: dict[str, Any], now: float) -> None:
    row = data.get("row") or {}
    node.kind = str(data.get("kind") or node.kind)
    node.pid = data.get("pid", node.pid)
    node.host = str(data.get("host", ""))
    node.incarnation = str(data.get("incarnation", ""))
    node.restarts = max(node.restarts, int(data.get("restarts", 0)))
    node.age_s = max(0.0, now - float(data.get("updated_at", data.get("started_at", now))))
    node.row = row
    node.env_steps = _float(row.get("env_steps"))
    node.env_steps_per_s = _float(row.get("steps_per_s")) if "steps_per_s" in row \
        else _float(data.get("env_steps_per_s"))
    node.policy_lag = _float(row.get("policy_lag"))
    batch = _float(row.get("batch_envs_mean"))
    if batch is not None:
        envs = _actor_envs(topo, str(data.get("node", "")))
        node.batch = f"{batch:.1f}" + (f"/{envs} ({batch / envs:.0%})" if envs else "")
    node.links = _links(data)
    queue = row.get("queue")  # a learner's unrolls waiting: its experience port's queue
    if isinstance(queue, int):
        for link in node.links:
            if link.role == "bind" and link.name == "experience":
                link.queue = queue


def _state(node: NodeView, data: dict[str, Any] | None, sup_node: dict[str, Any],
           sup_live: bool, here: str, now: float) -> str:
    said = sup_node.get("state")
    if said in ("restarting", "failed", "finished"):
        return "stopped" if said == "finished" else str(said)
    if data is None:
        return "starting"
    if data.get("state") == "stopped":
        return "stopped"
    same_host = data.get("host") == here
    gone = same_host and not pid_alive(data.get("pid"))
    if data.get("state") == "crashed" or gone:
        if sup_live:
            return "restarting"  # the supervisor has not noticed the exit yet
        return "down"
    interval = float(data.get("interval_s", 2.0))
    if node.age_s is not None and node.age_s > max(SILENT_AFTER_MIN_S,
                                                   SILENT_AFTER_INTERVALS * interval):
        return "silent"
    return "alive"


# ----- the table ----------------------------------------------------------------------
STATE_STYLE = {"alive": "green", "silent": "yellow", "restarting": "yellow",
               "failed": "bold red", "down": "red", "stopped": "dim", "starting": "cyan"}


def _rate(value: float | None) -> str:
    if value is None:
        return ""
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}" if value >= 10 or value == 0 else f"{value:.1f}"


def _bytes(value: float | None) -> str:
    if value is None:
        return ""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}B"


COLUMNS = (  # (header, justify); the table's columns, left to right
    ("node", "left"), ("kind", "left"), ("pid", "right"), ("host", "left"), ("inc", "left"),
    ("state", "left"), ("rst", "right"), ("steps/s", "right"), ("socket", "left"),
    ("peer", "left"), ("in/s", "right"), ("out/s", "right"), ("bytes/s", "right"),
    ("queue", "right"), ("batch", "right"), ("lag", "right"), ("age", "right"))
# What a narrow terminal loses first; what remains answers "who is the bottleneck".
DROP_ORDER = ("host", "inc", "age", "kind", "bytes/s", "pid", "peer")


def _cells(view: RunView) -> list[tuple[dict[str, Any], bool]]:
    """One dict of cells per table row (node columns on its first socket's row only),
    with whether the row ends a node."""
    rows = []
    for node in view.nodes:
        first = {"node": node.label, "kind": node.kind, "pid": str(node.pid or ""),
                 "host": node.host, "inc": node.incarnation[:6],
                 "state": Text(node.state, style=STATE_STYLE.get(node.state, "")),
                 "rst": str(node.restarts), "steps/s": _rate(node.env_steps_per_s),
                 "batch": node.batch,
                 "lag": "" if node.policy_lag is None else f"{node.policy_lag:.1f}",
                 "age": "" if node.age_s is None else f"{node.age_s:.0f}s"}
        links = node.links or [None]
        for i, link in enumerate(links):
            cells: dict[str, Any] = dict(first) if i == 0 else {}
            if link is not None:
                arrow = "<-" if link.role == "bind" else "->"
                cells.update({"socket": link.name, "peer": f"{arrow} {link.peer}",
                              "in/s": _rate(link.in_per_s), "out/s": _rate(link.out_per_s),
                              "bytes/s": _bytes(link.bytes_per_s),
                              "queue": "" if link.queue is None else str(link.queue)})
            rows.append((cells, i == len(links) - 1))
    return rows


def _table(rows: list[tuple[dict[str, Any], bool]], columns: list[tuple[str, str]]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold", expand=False)
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)
    for cells, last in rows:
        table.add_row(*(cells.get(name, "") for name, _ in columns), end_section=last)
    return table


def render(view: RunView, width: int | None = None) -> Group:
    """The run's header line and one table row per node socket; columns that do not fit
    in ``width`` characters are left out (``DROP_ORDER``), never squeezed into "…"."""
    head = Text.assemble(
        (f"{view.name}", "bold"), f"  {view.run_dir}  supervisor: {view.supervisor}")
    if view.env_steps is not None:
        head.append(f"  env steps {view.env_steps:,}")
    if view.return_mean_100 is not None:
        head.append(f"  return(100) {view.return_mean_100:.1f}")
    if view.time_s is not None:
        head.append(f"  {view.time_s:.0f}s")
    rows = _cells(view)
    columns = list(COLUMNS)
    if len({n.host for n in view.nodes if n.host}) <= 1:  # one host: said once, above
        columns.remove(("host", "left"))
        hosts = {n.host for n in view.nodes if n.host}
        if hosts:
            head.append(f"  host {hosts.pop()}")
    table = _table(rows, columns)
    if width is not None:
        measure = Console(width=10_000, file=io.StringIO())
        for name in DROP_ORDER:
            if table_width(measure, table) <= width:
                break
            columns = [c for c in columns if c[0] != name]
            table = _table(rows, columns)
    return Group(head, table)


def table_width(console: Console, table: Table) -> int:
    return console.measure(table).maximum


def latest_run(root: Path = Path("runs")) -> Path | None:
    """The run directory under ``root`` whose status files changed last."""
    best: tuple[float, Path] | None = None
    for status in Path(root).glob(f"**/{STATUS_DIR}"):
        try:
            mtime = max((p.stat().st_mtime for p in status.iterdir()), default=0.0)
        except OSError:
            continue
        if best is None or mtime > best[0]:
            best = (mtime, status.parent)
    return best[1] if best else None
