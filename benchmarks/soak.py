"""The hostile-peer soak (issue 29): each topology with and without foreign peers sending
valid-looking hostile messages to every bound port; restarts, memory and return compared.

    python benchmarks/soak.py [--minutes 10] [--topologies seed apex pbt_seed]
        [--repeats 2] [--peers 4] [--seed N] [--set key=value ...] [--out-dir DIR]
    python benchmarks/soak.py --dry-run --topologies seed     # 30 s per run: a check

Per topology and repeat, two runs of ``zmqrl up T --max-seconds S --run-dir D`` (same
seed, same budget), the arms alternating ABBA over the repeats (without/with, then
with/without: the machine drifts 10-30 %/minute). In the "with" arm, once the run's
``topology.yaml`` and every bound ipc socket exist, ``--peers`` processes of
``benchmarks/hostile.py`` start: the soak finds every bound port itself (each node
class's ``binds``/``accepts`` and ``Endpoints(...).bind_address``, plus the supervisor's
socket; :func:`hostile.discover`) and each peer sends hostile messages to all of them at
a bounded rate (50 messages/s and 2 MiB/s each by default; the kinds are in hostile.py).

Measured per run: node restarts (the supervisor's ``status/_supervisor.json``: a
label's ``starts`` - 1, and its "exited with" lines), each node's peak RSS (its process
and descendants, from /proc every second; the supervisor's own too), the final
``return_mean_100``/``env_steps``/``updates`` of ``metrics/run.csv``, every traceback in
the nodes' logs, each node's ``bad_messages``, the peers' own CPU time, and what the
peers sent and got back per port (``error`` texts, pong round trips, sends refused at
the high-water mark, pings unanswered for 10 s).

**Pass**, per topology, over the "with" runs against the "without" runs:

* no restarts, and ``zmqrl up`` exited 0 (no node failed for good);
* every node's peak RSS <= 1.5 x its peak without peers + 50 MiB. The 50 MiB is what a
  bounded node may legitimately hold for hostile input: a few messages of up to 1 MiB
  per connection (4 peers x 3 identities) in ZeroMQ's queues and the decoder, and the
  buffers of one oversized request while it is refused. The 1.5x covers allocator
  fragmentation that large transient messages leave in a Python process (glibc does
  not return most of it) and the run-to-run spread of a node's own peak. Memory that
  grows with time or connections (a leak, per-connection state) passes 1.5x in a
  10-minute soak;
* the mean return(100) with peers >= the mean without - the noise: the range of the
  no-peer returns over the repeats, at least ``--noise-floor`` (5 %) of their mean
  (with one repeat the floor alone: say so). And never, at any row of run.csv, above
  the highest return without + the noise: peers cannot help learning, so a higher return
  means returns they sent were counted (theirs are never plausible: 3e38, NaN, or 0-5;
  see hostile.py).

Written to ``--out-dir`` (default ``runs/soak-<time>``): ``summary.json`` (every run's
figures and the verdicts), ``summary.md`` (the tables), and each run's directory, logs
and ``zmqrl up`` output, with the peers' plans and stats.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hostile  # noqa: E402  (benchmarks/ is not a package)

REPO = Path(__file__).resolve().parents[1]
HOSTILE = Path(hostile.__file__).resolve()
PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 2**20
RSS_FACTOR, RSS_SLACK_MIB = 1.5, 50.0
DRY_RUN_S = 30.0  # start-up takes 5-10 s of it on 2 shared cores
READY_TIMEOUT_S = 90.0  # from start to every bound socket present
SERIES_EVERY_S = 10.0
EXITED = re.compile(r"supervisor: (\S+) exited with (-?\d+)")
REJECTED = re.compile(r"supervisor: rejected report \((\d+) so far\)")


# ----- /proc: the run's processes and their memory ----------------------------------------
def _proc_table() -> dict[int, tuple[int, int, float]]:
    """pid -> (ppid, rss bytes, cpu seconds) of every process we can read."""
    ticks = os.sysconf("SC_CLK_TCK")
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                tail = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        # fields after "(comm)": state ppid ... utime(14) stime(15) ... rss(24)
        table[int(entry)] = (int(tail[1]), int(tail[21]) * PAGE,
                             (int(tail[11]) + int(tail[12])) / ticks)
    return table


def _subtree(pid: int, children: dict[int, list[int]]) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


class MemorySampler:
    """Peak RSS of each node (its process tree) and of the supervisor, sampled."""

    def __init__(self, up_pid: int, run_dir: Path):
        self.up_pid, self.run_dir = up_pid, run_dir
        self.peak: dict[str, float] = {}  # label -> MiB
        self.series: dict[str, list[float]] = {}  # label -> MiB every SERIES_EVERY_S
        self.pids: dict[str, set[int]] = {}  # label -> every pid seen for it
        self._next_series = 0.0

    def sample(self) -> None:
        table = _proc_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        rss = {"supervisor": table.get(self.up_pid, (0, 0, 0))[1]}
        for label, pid in _node_pids(self.run_dir).items():
            if pid in table:
                self.pids.setdefault(label, set()).add(pid)
                rss[label] = sum(table[p][1] for p in _subtree(pid, children) if p in table)
        now = time.monotonic()
        take_series = now >= self._next_series
        if take_series:
            self._next_series = now + SERIES_EVERY_S
        for label, value in rss.items():
            mib = round(value / MIB, 1)
            self.peak[label] = max(self.peak.get(label, 0.0), mib)
            if take_series:
                self.series.setdefault(label, []).append(mib)


def _node_pids(run_dir: Path) -> dict[str, int]:
    try:
        nodes = json.loads((run_dir / "status" / "_supervisor.json").read_text())["nodes"]
        return {label: n["pid"] for label, n in nodes.items() if n.get("pid")}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


# ----- reading a finished run -------------------------------------------------------------
def _last_row(path: Path) -> dict[str, str]:
    try:
        with path.open(newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("time_s")]
    except OSError:
        return {}
    return rows[-1] if rows else {}


def _returns(path: Path) -> list[float]:
    """Every return(100) row of a run.csv (NaN rows: no episode yet; inf kept)."""
    try:
        with path.open(newline="") as f:
            values = [float(r["return_mean_100"]) for r in csv.DictReader(f)
                      if r.get("return_mean_100") not in (None, "")]
    except (OSError, ValueError, KeyError):
        return []
    return [v for v in values if v == v]


def _number(text: str | None) -> float | None:
    try:
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if value != value else value  # NaN: no episode yet


def _tracebacks(run_dir: Path) -> list[dict[str, Any]]:
    """Every traceback in the nodes' logs: label, the exception line, the innermost
    frame and how often (the same traceback again only counts)."""
    found: Counter = Counter()
    for log in sorted((run_dir / "logs").glob("*.log")):
        lines = [line.split(" ", 1)[1] if " " in line else line
                 for line in log.read_text(errors="replace").splitlines()]
        for i, line in enumerate(lines):
            if not line.startswith("Traceback (most recent call last)"):
                continue
            where, j = "", i + 1
            while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
                if lines[j].strip().startswith("File "):
                    where = lines[j].strip()
                j += 1
            exc = lines[j].strip() if j < len(lines) else "?"
            found[(log.stem, exc[:300], where[:200])] += 1
    return [{"label": k[0], "exception": k[1], "where": k[2], "count": n}
            for k, n in found.items()]


def _peer_totals(stats_files: list[Path]) -> dict[str, dict[str, Any]]:
    """The peers' stats summed per port."""
    ports: dict[str, dict[str, Any]] = {}
    for path in stats_files:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for key, s in data["ports"].items():
            p = ports.setdefault(key, {"sent": Counter(), "bytes": 0, "blocked": 0,
                                       "replies": Counter(), "errors": Counter(),
                                       "pongs": 0, "pong_ms_max": None,
                                       "unanswered_pings": 0})
            p["sent"].update(s["sent"])
            p["replies"].update(s["replies"])
            p["errors"].update(s["errors"])
            p["bytes"] += s["bytes"]
            p["blocked"] += s["blocked"]
            p["pongs"] += s["pongs"]
            p["unanswered_pings"] += s.get("unanswered_pings", 0)
            if s["pong_ms_max"] is not None:
                p["pong_ms_max"] = max(p["pong_ms_max"] or 0, s["pong_ms_max"])
    for p in ports.values():
        p["sent_total"] = sum(p["sent"].values())
        by_kind: Counter = Counter()
        for key, n in p["sent"].items():
            by_kind[key.split("/")[1]] += n
        p["by_kind"] = dict(by_kind)
        p["errors"] = dict(p["errors"].most_common(6))
        p["sent"], p["replies"] = dict(p["sent"]), dict(p["replies"])
    return ports


# ----- one run ----------------------------------------------------------------------------
def _ipc_paths(plan: dict[str, Any]) -> list[Path]:
    return [Path(t["address"][len("ipc://"):]) for t in plan["targets"]
            if t["address"].startswith("ipc://")]


def run_arm(topology: str, peers: int, repeat: int, seconds: float, args: argparse.Namespace,
            out_dir: Path) -> dict[str, Any]:
    """One ``zmqrl up`` of ``topology`` for ``seconds``, with ``peers`` hostile peers."""
    arm = "with" if peers else "without"
    name = f"{Path(topology).stem}-r{repeat}-{arm}"
    run_dir = out_dir / name
    cmd = [sys.executable, "-m", "zmqrl.cli", "up", topology, "--max-seconds", str(seconds),
           "--run-dir", str(run_dir)]
    for override in ([f"seed={args.seed}"] if args.seed is not None else []) + args.overrides:
        cmd += ["--set", override]
    up_log = out_dir / f"{name}.up.txt"
    started = time.monotonic()
    with up_log.open("w") as out:
        up = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                              start_new_session=True)
    sampler = MemorySampler(up.pid, run_dir)
    peer_procs: list[subprocess.Popen] = []
    stats_files: list[Path] = []
    peer_cpu: dict[int, float] = {}
    plan: dict[str, Any] | None = None
    peers_at = None
    loads = []
    deadline = started + seconds + 180  # start-up and shutdown beyond the budget
    try:
        while up.poll() is None:
            if time.monotonic() > deadline:
                up.send_signal(signal.SIGTERM)  # the supervisor stops its nodes
                up.wait(60)
                break
            sampler.sample()
            loads.append(os.getloadavg()[0])
            if peers and not peer_procs:
                if plan is None and (run_dir / "topology.yaml").exists():
                    try:
                        plan = hostile.discover(run_dir)
                    except Exception as exc:  # noqa: BLE001  (half written: next second)
                        print(f"soak:   no plan yet: {exc}", flush=True)
                    else:
                        (out_dir / f"{name}.plan.json").write_text(json.dumps(plan, indent=1))
                ready = plan is not None and (
                    all(p.exists() for p in _ipc_paths(plan)) and _node_pids(run_dir)
                    or time.monotonic() - started > READY_TIMEOUT_S)
                if ready:
                    peers_at = round(time.monotonic() - started, 1)
                    for k in range(peers):
                        stats = out_dir / f"{name}.peer{k}.json"
                        stats_files.append(stats)
                        peer_procs.append(subprocess.Popen(
                            [sys.executable, str(HOSTILE), "--plan",
                             str(out_dir / f"{name}.plan.json"), "--seed",
                             str(1000 * repeat + k), "--out", str(stats), "--rate",
                             str(args.peer_rate), "--bytes-rate", str(args.peer_bytes_rate),
                             "--identities", str(args.identities), "--seconds",
                             str(seconds + 120), "--watch-pid", str(up.pid),
                             "--kinds", *args.kinds],
                            cwd=REPO, stdout=(out_dir / f"{name}.peer{k}.txt").open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True))
            if peer_procs:
                table = _proc_table()
                for p in peer_procs:
                    if p.pid in table:
                        peer_cpu[p.pid] = table[p.pid][2]
            time.sleep(1.0)
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(60)
        for p in peer_procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in peer_procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    wall = time.monotonic() - started
    return _collect(topology, arm, repeat, run_dir, up, up_log, sampler, wall, peers_at,
                    peers, stats_files, peer_cpu, loads)


def _collect(topology: str, arm: str, repeat: int, run_dir: Path, up: subprocess.Popen,
             up_log: Path, sampler: MemorySampler, wall: float, peers_at: float | None,
             peers: int, stats_files: list[Path], peer_cpu: dict[int, float],
             loads: list[float]) -> dict[str, Any]:
    row = _last_row(run_dir / "metrics" / "run.csv")
    try:
        nodes = json.loads((run_dir / "status" / "_supervisor.json").read_text())["nodes"]
    except (OSError, ValueError, KeyError):
        nodes = {}
    text = up_log.read_text(errors="replace")
    exits = Counter(m.group(1) for m in EXITED.finditer(text))
    restarts = {label: max(int(n.get("starts", 1)) - 1, exits.get(label, 0),
                           len(sampler.pids.get(label, ())) - 1)
                for label, n in nodes.items()}
    rejected = [int(m.group(1)) for m in REJECTED.finditer(text)]
    bad = {}
    for path in sorted((run_dir / "metrics").glob("*.csv")):
        value = _number(_last_row(path).get("bad_messages"))
        if value:
            bad[path.stem] = int(value)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # not needed; replays are big
    return {
        "topology": Path(topology).stem, "arm": arm, "repeat": repeat, "rc": up.returncode,
        "wall_s": round(wall, 1), "peers": peers, "peers_started_s": peers_at,
        "return_100": _number(row.get("return_mean_100")),
        "return_20": _number(row.get("return_mean_20")),
        "return_100_max": max(_returns(run_dir / "metrics" / "run.csv"), default=None),
        "env_steps": int(_number(row.get("env_steps")) or 0),
        "updates": int(_number(row.get("updates")) or 0),
        "restarts": {k: v for k, v in restarts.items() if v},
        "exits": [line for line in text.splitlines() if "supervisor:" in line and (
            "exited with" in line or "failed for good" in line or "silent for" in line)][:40],
        "supervisor_rejected_reports": max(rejected, default=0),
        "stopped": next((line for line in text.splitlines()[::-1]
                         if line.startswith("zmqrl up: stopped")), ""),
        "peak_rss_mib": sampler.peak, "rss_series_mib": sampler.series,
        "bad_messages": bad, "tracebacks": _tracebacks(run_dir),
        "peers_cpu_s": round(sum(peer_cpu.values()), 1),
        "load": round(statistics.mean(loads), 2) if loads else None,
        "hostile": _peer_totals(stats_files),
        "run_dir": str(run_dir),
    }


# ----- verdicts and tables ----------------------------------------------------------------
def verdict(runs: list[dict[str, Any]], noise_floor: float) -> dict[str, Any]:
    """The pass rule (module docstring) for one topology's runs."""
    no = [r for r in runs if r["arm"] == "without"]
    yes = [r for r in runs if r["arm"] == "with"]
    out: dict[str, Any] = {"reasons": []}
    restarts = sum(sum(r["restarts"].values()) for r in yes)
    failed = [r["rc"] for r in yes if r["rc"] != 0]
    out["restarts"] = restarts
    if restarts or failed:
        out["reasons"].append(f"{restarts} restarts with peers"
                              + (f", zmqrl up exited {failed}" if failed else ""))
    baseline_broken = [r for r in no if r["restarts"] or r["rc"] != 0]
    if baseline_broken:
        out["reasons"].append("the run without peers restarted or failed too")
    rss = {}
    for label in sorted({k for r in yes for k in r["peak_rss_mib"]}):
        with_peak = max(r["peak_rss_mib"].get(label, 0.0) for r in yes)
        base = [r["peak_rss_mib"][label] for r in no if label in r["peak_rss_mib"]]
        if not base:
            continue
        bound = RSS_FACTOR * max(base) + RSS_SLACK_MIB
        rss[label] = {"with": with_peak, "without": max(base), "bound": round(bound, 1),
                      "ok": with_peak <= bound}
        if with_peak > bound:
            out["reasons"].append(f"{label} peak RSS {with_peak:.0f} MiB > bound "
                                  f"{bound:.0f} MiB ({RSS_FACTOR} x {max(base):.0f} + "
                                  f"{RSS_SLACK_MIB:.0f})")
    out["rss"] = rss
    r_no = [r["return_100"] for r in no if r["return_100"] is not None]
    r_yes = [r["return_100"] if r["return_100"] is not None else 0.0 for r in yes]
    if r_no and r_yes:
        mean_no, mean_yes = statistics.mean(r_no), statistics.mean(r_yes)
        measured = max(r_no) - min(r_no) if len(r_no) > 1 else None
        noise = max(measured or 0.0, noise_floor * mean_no)
        out.update(return_without=round(mean_no, 1), return_with=round(mean_yes, 1),
                   noise=round(noise, 1), noise_measured=measured is not None)
        if mean_yes < mean_no - noise:
            out["reasons"].append(f"return(100) {mean_yes:.1f} with peers < {mean_no:.1f} "
                                  f"without - noise {noise:.1f}")
        # Peers cannot help learning: a return above any seen without them, at any time
        # of the run, means returns they sent were counted.
        top_no = max((r["return_100_max"] for r in no if r["return_100_max"] is not None),
                     default=max(r_no))
        top_yes = max((r["return_100_max"] for r in yes if r["return_100_max"] is not None),
                      default=mean_yes)
        if max(top_yes, mean_yes) > top_no + noise:
            out["reasons"].append(f"return(100) reached {max(top_yes, mean_yes):.3g} with "
                                  f"peers, > {top_no:.1f} without + noise {noise:.1f}: "
                                  "returns the peers sent were counted")
    else:
        out["reasons"].append("no return to compare (no episodes finished)")
    out["pass"] = not out["reasons"]
    return out


def markdown(results: list[dict[str, Any]], verdicts: dict[str, dict[str, Any]]) -> str:
    lines = ["| topology | run | rc | return(100) | env steps | updates | restarts | "
             "max node peak RSS (MiB) | tracebacks | bad messages | peers' CPU s | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        peak = max(((v, k) for k, v in r["peak_rss_mib"].items() if k != "supervisor"),
                   default=(0.0, "-"))
        lines.append(
            f"| {r['topology']} | r{r['repeat']} {r['arm']} | {r['rc']} | "
            f"{r['return_100'] if r['return_100'] is not None else '—'} | "
            f"{r['env_steps']:,} | {r['updates']:,} | "
            f"{sum(r['restarts'].values())} | {peak[0]:.0f} ({peak[1]}) | "
            f"{sum(t['count'] for t in r['tracebacks'])} | {sum(r['bad_messages'].values()):,} | "
            f"{r['peers_cpu_s']} | {r['load']} |")
    lines += ["", "| topology | verdict | restarts with peers | return(100) without → with "
                  "(noise) | worst RSS with / bound (MiB) | why not |", "|---|---|---|---|---|---|"]
    for topo, v in verdicts.items():
        worst = max(v["rss"].items(), key=lambda kv: kv[1]["with"] / kv[1]["bound"],
                    default=None)
        rss = f"{worst[0]} {worst[1]['with']:.0f} / {worst[1]['bound']:.0f}" if worst else "—"
        ret = (f"{v.get('return_without')} → {v.get('return_with')} ({v.get('noise')}"
               f"{'' if v.get('noise_measured') else ', floor'})") if "noise" in v else "—"
        lines.append(f"| {topo} | {'PASS' if v['pass'] else 'FAIL'} | {v['restarts']} | {ret} | "
                     f"{rss} | {'; '.join(v['reasons']) or '—'} |")
    hostile_rows = []
    for r in results:
        for port, p in sorted(r["hostile"].items()):
            hostile_rows.append(
                f"| {r['topology']} r{r['repeat']} | {port} | {p['sent_total']:,} | "
                f"{p['replies'].get('error', 0):,} | {p['blocked']:,} | {p['pongs']} | "
                f"{p['pong_ms_max'] if p['pong_ms_max'] is not None else '—'} | "
                f"{p['unanswered_pings']} |")
    if hostile_rows:
        lines += ["", "| run | port | hostile sent | error replies | refused at HWM | "
                      "pongs | slowest pong ms | pings unanswered 10 s |",
                  "|---|---|---|---|---|---|---|---|", *hostile_rows]
    failures = [(r, t) for r in results for t in r["tracebacks"]]
    if failures:
        lines += ["", "Tracebacks:", ""]
        lines += [f"- {r['topology']} r{r['repeat']} {r['arm']}: `{t['label']}` ×{t['count']}: "
                  f"{t['exception']} (at {t['where']})" for r, t in failures]
    return "\n".join(lines) + "\n"


# ----- main -------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="budget of each run")
    parser.add_argument("--topologies", nargs="+", default=["seed", "apex", "pbt_seed"],
                        help="names under topologies/ or paths")
    parser.add_argument("--repeats", type=int, default=2, help="pairs of runs per topology")
    parser.add_argument("--peers", type=int, default=4, help="hostile peer processes")
    parser.add_argument("--peer-rate", type=float, default=50.0, help="messages/s per peer")
    parser.add_argument("--peer-bytes-rate", type=float, default=2 * 2**20,
                        help="bytes/s per peer")
    parser.add_argument("--identities", type=int, default=3,
                        help="connections (identities) per port per peer")
    parser.add_argument("--kinds", nargs="+", choices=hostile.KINDS, default=list(hostile.KINDS),
                        help="hostile kinds the peers send (default: all; to isolate one)")
    parser.add_argument("--seed", type=int, help="--set seed=N in both arms (default: the "
                                                 "topology's)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="topology override for both arms")
    parser.add_argument("--noise-floor", type=float, default=0.05,
                        help="least return noise, as a fraction of the no-peer return")
    parser.add_argument("--dry-run", action="store_true",
                        help=f"{DRY_RUN_S:.0f} s per run and one repeat unless --repeats")
    parser.add_argument("--out-dir", type=Path)
    args = parser.parse_args()
    seconds = DRY_RUN_S if args.dry_run else args.minutes * 60
    if args.dry_run and "--repeats" not in sys.argv:
        args.repeats = 1
    out_dir = (args.out_dir or REPO / "runs" / time.strftime("soak-%Y%m%d-%H%M%S")).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    verdicts: dict[str, dict[str, Any]] = {}
    for name in args.topologies:
        topology = name if name.endswith((".yaml", ".yml")) else f"topologies/{name}.yaml"
        if Path(topology).exists():  # relative to here; else to the checkout (zmqrl up's cwd)
            topology = str(Path(topology).resolve())
        runs = []
        for repeat in range(args.repeats):
            arms = (0, args.peers) if repeat % 2 == 0 else (args.peers, 0)  # ABBA
            for peers in arms:
                print(f"soak: {Path(topology).stem} repeat {repeat} "
                      f"{'with' if peers else 'without'} peers, {seconds:g} s ...", flush=True)
                r = run_arm(topology, peers, repeat, seconds, args, out_dir)
                print(f"soak:   rc {r['rc']}, return(100) {r['return_100']}, env steps "
                      f"{r['env_steps']:,}, restarts {sum(r['restarts'].values())}, "
                      f"tracebacks {sum(t['count'] for t in r['tracebacks'])}", flush=True)
                runs.append(r)
                results.append(r)
                _save(out_dir, args, seconds, results, verdicts)
        v = verdict(runs, args.noise_floor)
        verdicts[Path(topology).stem] = v
        print(f"soak: {Path(topology).stem}: {'PASS' if v['pass'] else 'FAIL'}"
              + (f" ({'; '.join(v['reasons'])})" if v["reasons"] else ""), flush=True)
        _save(out_dir, args, seconds, results, verdicts)
    print()
    print(markdown(results, verdicts))
    print(f"soak: {out_dir}/summary.json, summary.md")


def _save(out_dir: Path, args: argparse.Namespace, seconds: float,
          results: list[dict[str, Any]], verdicts: dict[str, dict[str, Any]]) -> None:
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    (out_dir / "summary.json").write_text(json.dumps(
        {"settings": {**settings, "seconds": seconds, "rss_factor": RSS_FACTOR,
                      "rss_slack_mib": RSS_SLACK_MIB},
         "runs": results, "verdicts": verdicts}, indent=1, default=list))
    (out_dir / "summary.md").write_text(markdown(results, verdicts))


if __name__ == "__main__":
    main()
