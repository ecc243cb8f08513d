"""Every GPU check of issue 30 in one run, for a lent GPU machine's short lease: the CUDA
tests, ``zmqrl bench`` on CUDA, SEED on Pong for a fixed budget, and acting throughput
against N copies of the no-network limit. Writes ``gpu.json`` (after every step) and the
Pong run's CSVs under ``--out``; ``--dry-run`` runs it all on a CPU in about two minutes."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STEPS = ("gpu_tests", "bench", "pong", "scaling")

# The layout for 16 cores (one value per bench topology, or one for all). 14 actor
# processes: an actor steps its envs in one Python thread, so one core each; the two
# cores left hold the broker (its Python thread and ZeroMQ's I/O threads), the sink and
# the supervisor. 14 is also the Pong run's and the scaling's top point, so this bench is
# the scaling's 14-actor row, measured once. Two lanes let an actor step one half of its
# envs while the broker answers the other (the 2-core benchmarks' best layout). 128
# CartPole envs an actor (64 a request): a CartPole step is ~12 us, and fewer envs a
# request multiply the requests one broker must serve (14 actors at 16 envs a request
# would send 4x as many). Pong is not benched by default: its figure on the GPU is the
# Pong run's frames/s, and zmqrl bench's limit would step all 14 x 32 Atari envs in one
# process, whose making and resetting alone take ~1 minute of the 8 (add it with
# --bench-topologies topologies/seed.yaml topologies/seed_atari.yaml --bench-envs 128 32).
BENCH_TOPOLOGIES = ["topologies/seed.yaml"]
BENCH_ACTORS = [14]
BENCH_ENVS = [128]
BENCH_LANES = [2]
BENCH_SETS = ["nodes.broker.args.device={device}"]
SCALING = [1, 2, 4, 8, 14]

# SEED on Pong: the learner and the broker on the GPU, 14 actor processes x 32 envs (as
# many as 16 cores serve; see above). --pong-set adds to these (a later one wins).
PONG_SETS = ["nodes.learner.args.device={device}", "nodes.broker.args.device={device}",
             "nodes.actor.replicas=14", "nodes.actor.args.envs=32"]
# The dry run: one actor x 4 envs on the CPU, a small batch (a CPU update on 32 x 20
# frames takes seconds), episodes cut at 200 steps so that a 20 s run finishes some.
DRY_PONG_SETS = ["nodes.learner.args.device=cpu", "nodes.broker.args.device=cpu",
                 "nodes.actor.replicas=1", "nodes.actor.args.envs=4", "algo.batch_size=4",
                 "env.kwargs.max_episode_steps=200"]
TARGET = 18.0  # Pong's return(100) goal
TAIL_LINES = 40


class Interrupted(BaseException):
    """SIGTERM, SIGINT or SIGHUP: stop the step's process, write what we have, exit.
    (Not an Exception: no handler of a step's errors may swallow it.)"""


class StepFailed(Exception):
    """A check that ran and failed (its reason is recorded)."""


# ----- processes -----------------------------------------------------------------------
def stop_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the process's group (zmqrl up and bench stop their nodes on it), then
    SIGKILL whatever is left of it (``zmqrl.bus.lifetime``, as the supervisors do)."""
    from zmqrl.bus.lifetime import end_group, signal_group

    if signal_group(proc.pid, signal.SIGTERM):
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    end_group(proc.pid)
    proc.wait()


def run_cmd(cmd: list[str], log: Path, timeout: float,
            started: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run ``cmd`` in its own session (dying with us), output to ``log``; past
    ``timeout`` its group is stopped. Returns its return code, seconds and whether it
    timed out."""
    from zmqrl.bus.lifetime import child_preexec  # imported here, not between fork and exec

    start = time.monotonic()
    with open(log, "w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=child_preexec,
                                env=child_env())
        timed_out = False
        if started is not None:  # threads start after the fork (preexec_fn runs in it)
            started()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc.poll() is None:
                stop_group(proc)
    return {"command": " ".join(cmd), "returncode": proc.returncode, "timed_out": timed_out,
            "seconds": round(time.monotonic() - start, 1)}


def child_env() -> dict[str, str]:
    """Ours, with the repository first on the path (a machine where zmqrl is not
    installed but its checkout and metadata are)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def check(done: dict[str, Any], log: Path, what: str) -> None:
    if done["timed_out"] or done["returncode"] != 0:
        raise StepFailed(f"{what}: " + ("timed out" if done["timed_out"] else
                                        f"exit code {done['returncode']}")
                         + f"; log {log.name}:\n{tail(log, 15)}")


def zmqrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "zmqrl.cli", *args]


# ----- topologies and CSVs -------------------------------------------------------------
def derived_topology(source: str, sets: list[str], dest: Path) -> Path:
    """``source`` with ``sets`` applied (``zmqrl bench`` takes no --set): written to
    ``dest``; its import paths stay those of the original's directory."""
    import yaml

    from zmqrl.cli import _overrides
    from zmqrl.run.topology import merge

    src = (REPO / source).resolve()
    raw = yaml.safe_load(src.read_text())
    paths = [str((src.parent / p).resolve()) for p in raw.get("import_paths", [])]
    raw["import_paths"] = [*paths, str(src.parent)]
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(yaml.safe_dump(merge(raw, _overrides(tuple(sets))), sort_keys=False))
    return dest


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def number(value: str | None) -> float | None:
    try:
        out = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return out if out is not None and math.isfinite(out) else None


def steady_mean(rows: list[dict[str, str]], column: str, warmup: float) -> float | None:
    """Mean of ``column`` over rows after ``warmup`` seconds, but the last (written while
    stopping)."""
    values = [number(r.get(column)) for r in rows[:-1] if (number(r.get("time_s")) or 0) >= warmup]
    values = [v for v in values if v is not None]
    return round(statistics.mean(values), 3) if values else None


def thin(points: list[list[float]], most: int = 400) -> list[list[float]]:
    step = max(1, math.ceil(len(points) / most))
    return points[::step] + ([points[-1]] if points and (len(points) - 1) % step else [])


# ----- the device ----------------------------------------------------------------------
def host_info() -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": os.cpu_count(),
                            "cpus_usable": len(os.sched_getaffinity(0)),
                            "python": sys.version.split()[0]}
    probe = ("import json, torch; c = torch.cuda.is_available(); print(json.dumps("
             "{'torch': torch.__version__, 'cuda': c, "
             "'gpu': torch.cuda.get_device_name(0) if c else None}))")
    try:  # in a child: this process holds no CUDA context
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             timeout=120)
        info.update(json.loads(out.stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, IndexError, json.JSONDecodeError) as exc:
        info["torch_error"] = repr(exc)
    smi = nvidia_smi("name,memory.total,driver_version")
    info["nvidia_smi"] = smi[0] if smi else None
    return info


def nvidia_smi(query: str) -> list[list[str]] | None:
    """One row per GPU of ``nvidia-smi --query-gpu=query``, or None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
    except subprocess.SubprocessError:
        return None
    rows = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines()
            if line.strip()]
    return rows or None


class Sampler(threading.Thread):
    """Every ``interval`` s: the load average and, where nvidia-smi is, the first GPU's
    utilization (%) and memory used (MiB)."""

    def __init__(self, interval: float = 2.0):
        super().__init__(daemon=True)
        self.interval = interval
        self.stop = threading.Event()
        self.smi = shutil.which("nvidia-smi") is not None
        self.samples: list[list[float | None]] = []  # [t, util, mem_mib, load1]
        self.start_time = time.monotonic()

    def run(self) -> None:
        self.start_time = time.monotonic()
        while not self.stop.is_set():
            util = mem = None
            if self.smi:
                rows = nvidia_smi("utilization.gpu,memory.used")
                if rows:
                    util, mem = number(rows[0][0]), number(rows[0][1])
            self.samples.append([round(time.monotonic() - self.start_time, 1), util, mem,
                                 round(os.getloadavg()[0], 2)])
            self.stop.wait(self.interval)

    def summary(self) -> dict[str, Any]:
        gpu = [s for s in self.samples if s[1] is not None]
        load = [s[3] for s in self.samples]
        return {
            "gpu": {"util_mean": round(statistics.mean(s[1] for s in gpu), 1),
                    "util_max": max(s[1] for s in gpu),
                    "mem_used_max_mib": max(s[2] or 0 for s in gpu),
                    "samples": [[s[0], s[1], s[2]] for s in gpu]} if gpu else None,
            "load1": {"mean": round(statistics.mean(load), 2), "max": max(load),
                      "samples": [[s[0], s[3]] for s in self.samples]} if load else None,
        }


# ----- the N copies of the no-network limit -----------------------------------------------
def _limit_copy(topology: str, envs: int, seconds: float, ready: Any, results: Any) -> None:
    """One copy of ``zmqrl bench``'s no-network limit (in a spawned process): load, wait
    for every copy, measure."""
    from zmqrl.run.bench import no_network_limit
    from zmqrl.run.topology import load

    topo = load(topology)
    ready.wait(timeout=300)
    results.put(no_network_limit(topo, envs, seconds)["steps_per_s"])


def limit_copies(topology: Path, copies: int, envs: int, seconds: float) -> list[float]:
    """Env steps/s of each of ``copies`` concurrent processes, each one no-network limit
    of ``envs`` envs (what ``copies`` actors would reach with no bus between them and a
    broker). They start measuring together, once all have loaded."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    ready, results = ctx.Barrier(copies), ctx.Queue()
    procs = [ctx.Process(target=_limit_copy, daemon=True,
                         args=(str(topology), envs, seconds, ready, results))
             for _ in range(copies)]
    for proc in procs:
        proc.start()
    try:
        deadline = time.monotonic() + seconds + 300
        rates = []
        while len(rates) < copies:
            if time.monotonic() > deadline:
                raise StepFailed(f"{copies} limit copies: only {len(rates)} reported in time")
            try:
                rates.append(results.get(timeout=1.0))
            except queue.Empty:  # a copy that died never reports
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise StepFailed("a limit copy failed: exit codes "
                                     f"{[p.exitcode for p in procs]}") from None
        return rates
    finally:
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()


# ----- the steps -----------------------------------------------------------------------
class Run:
    """The run's options, folders and results (written to gpu.json after every step)."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work).resolve() if args.work else \
            Path(tempfile.mkdtemp(prefix="zmqrl-gpu-"))
        self.logs = self.work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.results: dict[str, Any] = {
            "schema": 1, "dry_run": args.dry_run,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "argv": sys.argv[1:], "options": {k: v for k, v in vars(args).items()},
            "steps": {}}
        self.bench_reports: dict[tuple, dict[str, Any]] = {}

    def save(self) -> None:
        path = self.out / "gpu.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.results, indent=1) + "\n")
        tmp.replace(path)
        # the steps' logs and bench reports in one file: what comes back from a lent
        # machine is at most 8 files
        with tarfile.open(self.out / "logs.tar.gz", "w:gz") as tar:
            tar.add(self.logs, arcname="logs")

    def step(self, name: str, body: Callable[[dict[str, Any]], None]) -> None:
        entry: dict[str, Any] = {"status": "running"}
        self.results["steps"][name] = entry
        self.save()
        start = time.monotonic()
        print(f"== {name} ...", flush=True)
        try:
            body(entry)
            entry["status"] = "ok"
        except Interrupted:
            entry["status"] = "interrupted"
            raise
        except StepFailed as exc:
            entry["status"], entry["error"] = "failed", str(exc)
        except Exception as exc:  # a defect in this script or a broken figure: recorded
            entry["status"], entry["error"] = "failed", f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()[-3000:]
        finally:
            entry["seconds"] = round(time.monotonic() - start, 1)
            self.save()
            print(f"== {name}: {entry['status']} in {entry['seconds']} s"
                  + (f"\n{entry['error']}" if "error" in entry else ""), flush=True)

    # 1. the CUDA tests
    def gpu_tests(self, entry: dict[str, Any]) -> None:
        # -n0 on the dry run (they all skip; no workers to start); on the GPU four
        # workers and --dist load, so that the two 40 s AlphaZero runs overlap
        spread = ["-n0"] if self.args.dry_run else ["-n", "4", "--dist", "load"]
        log = self.logs / "gpu_tests.log"
        # Only the files that mark a test gpu: collecting all of tests/ costs ~10 s
        files = sorted(str(p) for p in (REPO / "tests").glob("test_*.py")
                       if "mark.gpu" in p.read_text())
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
               *spread, *files]
        done = run_cmd(cmd, log, self.args.tests_timeout)
        entry.update(done)
        summary = next((line for line in reversed(tail(log, 200).splitlines())
                        if re.search(r"\bin [\d.]+s\b", line)), "")
        counts = {word: int(n) for n, word in re.findall(
            r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)", summary)}
        entry.update(passed=counts.get("passed", 0), failed=counts.get("failed", 0),
                     skipped=counts.get("skipped", 0),
                     errors=counts.get("errors", counts.get("error", 0)),
                     summary=summary.strip("= "), tail=tail(log))
        check(done, log, "pytest -m gpu")

    # 2. zmqrl bench on the device
    def bench_once(self, topology: str, actors: int, envs: int, lanes: int) -> dict[str, Any]:
        """``zmqrl bench`` of ``topology`` with the broker on the device; its --json
        report, with the command. Measured once per layout (the scaling reuses it)."""
        key = (topology, actors, envs, lanes, self.args.bench_seconds)
        if key in self.bench_reports:
            return {**self.bench_reports[key], "reused": True}
        stem = Path(topology).stem
        derived = derived_topology(topology, self.bench_sets, self.work / "topologies" /
                                   f"bench-{stem}.yaml")
        name = f"bench-{stem}-{actors}x{envs}x{lanes}"
        report_path, log = self.logs / f"{name}.json", self.logs / f"{name}.log"
        cmd = zmqrl("bench", "--topology", str(derived), "--actors", str(actors),
                    "--envs", str(envs), "--lanes", str(lanes),
                    "--seconds", f"{self.args.bench_seconds:g}", "--json", str(report_path))
        # two limits, the topology after its warm-up, start-up (Atari envs take a while)
        done = run_cmd(cmd, log, 4 * self.args.bench_seconds + 240)
        check(done, log, name)
        out = {"topology": topology, "actors": actors, "envs": envs, "lanes": lanes,
               "sets": self.bench_sets, **done,
               "report": json.loads(report_path.read_text())}
        self.bench_reports[key] = out
        return out

    @property
    def bench_sets(self) -> list[str]:
        return [s.format(device=self.args.device) for s in BENCH_SETS] + self.args.bench_set

    def layouts(self) -> list[tuple[str, int, int, int]]:
        """(topology, actors, envs, lanes) of each bench topology."""
        a = self.args
        return list(zip(a.bench_topologies, a.bench_actors, a.bench_envs, a.bench_lanes,
                        strict=True))

    def bench(self, entry: dict[str, Any]) -> None:
        entry["runs"] = runs = []
        failures = []
        for topology, actors, envs, lanes in self.layouts():
            try:
                runs.append(self.bench_once(topology, actors, envs, lanes))
            except StepFailed as exc:
                failures.append(str(exc))
                runs.append({"topology": topology, "actors": actors, "envs": envs,
                             "lanes": lanes, "error": str(exc)})
            self.save()
        if failures:
            raise StepFailed("\n".join(failures))

    # 3. SEED on Pong
    def pong(self, entry: dict[str, Any]) -> None:
        args = self.args
        defaults = DRY_PONG_SETS if args.dry_run else \
            [s.format(device=args.device) for s in PONG_SETS]
        sets = defaults + args.pong_set
        run_dir = self.work / "pong"
        cmd = zmqrl("up", args.pong_topology, "--max-seconds", f"{args.pong_seconds:g}",
                    "--run-dir", str(run_dir))
        for pair in sets:
            cmd += ["--set", pair]
        entry.update(topology=args.pong_topology, sets=sets, seconds_budget=args.pong_seconds)
        sampler = Sampler()
        log = self.logs / "pong.log"
        try:
            done = run_cmd(cmd, log, args.pong_seconds + 240, started=sampler.start)
            entry.update(done)
        finally:  # interrupted too: what the run wrote so far is worth keeping
            sampler.stop.set()
            if sampler.is_alive():
                sampler.join()
            entry.update(sampler.summary())
            entry["log_tail"] = tail(log)
            metrics = run_dir / "metrics"
            if metrics.exists():
                self.copy_run(run_dir, self.out / "pong")
            if (metrics / "run.csv").exists():
                entry.update(pong_figures(metrics, args.frame_skip, args.pong_seconds))
        check(done, log, "zmqrl up (Pong)")
        if not entry.get("curve"):
            raise StepFailed("Pong: no episode finished (the return curve is empty)")

    def copy_run(self, run_dir: Path, dest: Path) -> None:
        """The run's run, learner and broker CSVs as files, and every CSV, the logs' last
        200 kB and the resolved topology in one archive (at most 8 files come back)."""
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("run", "learner", "broker"):
            src = run_dir / "metrics" / f"{name}.csv"
            if src.exists():
                shutil.copy(src, dest / f"{name}.csv")
        with tarfile.open(dest / "run.tar.gz", "w:gz") as tar:
            for path in sorted((run_dir / "metrics").glob("*.csv")):
                tar.add(path, arcname=f"metrics/{path.name}")
            for path in sorted((run_dir / "logs").glob("*.log")):
                data = path.read_bytes()[-200_000:]
                info = tarfile.TarInfo(f"logs/{path.name}")
                info.size, info.mtime = len(data), int(time.time())
                tar.addfile(info, io.BytesIO(data))
            if (run_dir / "topology.yaml").exists():
                tar.add(run_dir / "topology.yaml", arcname="topology.yaml")

    # 4. scaling against N copies of the limit
    def scaling(self, entry: dict[str, Any]) -> None:
        args = self.args
        topology = args.scaling_topology
        layouts = {t: (e, la) for t, _, e, la in self.layouts()}
        envs = args.scaling_envs or layouts.get(topology, (args.bench_envs[0],))[0]
        lanes = args.scaling_lanes or layouts.get(topology, (0, args.bench_lanes[0]))[1]
        derived = derived_topology(topology, self.bench_sets, self.work / "topologies" /
                                   f"scaling-{Path(topology).stem}.yaml")
        entry.update(topology=topology, envs=envs, lanes=lanes, bench_seconds=args.bench_seconds,
                     how=("topology: zmqrl bench (broker on the device, a sink for the "
                          "learner); limit: N concurrent processes, each zmqrl bench's "
                          "no-network limit of `envs` envs, measured right after it (for "
                          "N = 1, zmqrl bench's own limit: one copy); "
                          "bench_ratio: zmqrl bench's own, against ONE process stepping "
                          "all N x envs envs"))
        entry["rows"] = rows = []
        failures = []
        for actors in args.scaling:
            row: dict[str, Any] = {"actors": actors}
            rows.append(row)
            try:
                bench = self.bench_once(topology, actors, envs, lanes)
                report = bench["report"]
                # one process of `envs` envs is one copy: zmqrl bench measured it, twice
                rates = [report["limit_steps_per_s"]] if actors == 1 else \
                    limit_copies(derived, actors, envs, args.bench_seconds)
                copies = sum(rates)
                row.update(
                    topology_steps_per_s=report["topology_steps_per_s"],
                    copies_steps_per_s=round(copies),
                    copy_steps_per_s=[round(r) for r in rates],
                    ratio=round(report["topology_steps_per_s"] / copies, 3),
                    bench_limit_steps_per_s=report["limit_steps_per_s"],
                    bench_ratio=report["ratio"],
                    batch_envs_mean=report["batch_envs_mean"],
                    latency_p50_ms=report["latency_p50_ms"],
                    cpu_cores=report["cpu_cores"], reused=bench.get("reused", False))
            except StepFailed as exc:
                row["error"] = str(exc)
                failures.append(f"{actors} actors: {exc}")
            self.save()
            print(f"   {actors} actors: {row.get('ratio', 'failed')}", flush=True)
        top = max((r for r in rows if "ratio" in r), key=lambda r: r["actors"], default=None)
        entry["goal"] = {"actors": top["actors"], "ratio": top["ratio"], "at_least": 0.8,
                         "met": top["ratio"] >= 0.8} if top else None
        if failures:
            raise StepFailed("\n".join(failures))


def pong_figures(metrics: Path, frame_skip: int, budget: float) -> dict[str, Any]:
    """What the Pong run shows, from its metrics CSVs."""
    run = read_rows(metrics / "run.csv")
    curve = [[number(r["time_s"]), number(r["return_mean_100"])] for r in run
             if int(r.get("episodes") or 0) > 0 and number(r["return_mean_100"]) is not None]
    stepping = [r for r in run if int(r["env_steps"] or 0) > 0]
    first, last = (stepping[0], stepping[-1]) if stepping else (None, None)
    span = (float(last["time_s"]) - float(first["time_s"])) if stepping else 0.0
    rate = (int(last["env_steps"]) - int(first["env_steps"])) / span if span > 0 else None
    reached = next((r for r in run if int(r.get("episodes") or 0) >= 100
                    and (number(r["return_mean_100"]) or -math.inf) >= TARGET), None)
    end = run[-1] if run else {}
    updates = int(end.get("updates") or 0)
    out: dict[str, Any] = {
        "curve": thin(curve), "curve_columns": ["time_s", "return_mean_100"],
        "env_steps": int(end.get("env_steps") or 0), "episodes": int(end.get("episodes") or 0),
        "wall_s": number(end.get("time_s")),
        "return_100_end": number(end.get("return_mean_100")),
        "frames_per_s": round(rate * frame_skip) if rate else None,
        "env_steps_per_s": round(rate) if rate else None,
        "stepping_from_s": number(first["time_s"]) if first else None,
        "learner_updates": updates,
        "updates_per_s": round(updates / span, 2) if span > 0 else None,
        # as --target-return counts it: over 100 finished episodes
        "first_reached_18_s": number(reached["time_s"]) if reached else None,
        "first_reached_18_env_steps": int(reached["env_steps"]) if reached else None,
    }
    warmup = min(10.0, budget / 4)
    learner_path = metrics / "learner.csv"
    if learner_path.exists():
        learner = read_rows(learner_path)
        entropy = [[int(r["updates"]), number(r.get("entropy"))] for r in learner
                   if number(r.get("entropy")) is not None]
        out["entropy"] = thin(entropy, 100)
        out["entropy_columns"] = ["updates", "entropy"]
        lags = [number(r.get("policy_lag")) for r in learner]
        lags = [v for v in lags if v is not None]
        out["policy_lag_median"] = statistics.median(lags) if lags else None
    cpu = {p.stem: steady_mean(read_rows(p), "cpu_cores", warmup)
           for p in sorted(metrics.glob("*.csv")) if p.stem != "run"}
    out["cpu_cores"] = {k: v for k, v in cpu.items() if v is not None}
    actors = [v for k, v in out["cpu_cores"].items() if k.startswith("actor")]
    env_cores = [steady_mean(read_rows(p), "env_cores", warmup)
                 for p in sorted(metrics.glob("actor*.csv"))]
    env_cores = [v for v in env_cores if v is not None]
    out["actors_cpu"] = {"count": len(actors), "cores_mean": round(statistics.mean(actors), 3),
                         "cores_min": min(actors), "cores_max": max(actors),
                         "env_cores_mean": round(statistics.mean(env_cores), 3)
                         if env_cores else None} if actors else None
    broker_path = metrics / "broker.csv"
    if broker_path.exists():
        out["broker_batch_envs_mean"] = steady_mean(read_rows(broker_path), "batch_envs_mean",
                                                    warmup)
    return out


# ----- main ----------------------------------------------------------------------------
class _Help(argparse.HelpFormatter):
    """Says a default where one is set and the help does not say it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default not in (None, argparse.SUPPRESS, False, []) and "default" not in text:
            text += " (default: %(default)s)"
        return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=_Help)
    p.add_argument("--out", default=os.environ.get("OUT"),
                   help="results folder (default: $OUT): gpu.json, logs.tar.gz, pong/")
    p.add_argument("--work", help="run directories and logs (default: a temp folder, "
                   "removed at the end)")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny budgets on the CPU: the script's own test")
    p.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS),
                   help="the steps to run (a rerun can take the ones that failed)")
    p.add_argument("--device", help="the broker's and the learner's device (default: "
                   "cuda; dry run: cpu)")
    p.add_argument("--tests-timeout", type=float, default=300.0, help="seconds")
    p.add_argument("--bench-topologies", nargs="+", default=BENCH_TOPOLOGIES,
                   help="what zmqrl bench measures on the device")
    p.add_argument("--bench-actors", nargs="+", type=int, help="actor processes: one "
                   f"value, or one per bench topology (default: {BENCH_ACTORS}; dry run: [1])")
    p.add_argument("--bench-envs", nargs="+", type=int, help="envs per actor, likewise "
                   f"(default: {BENCH_ENVS}; dry run: [16])")
    p.add_argument("--bench-lanes", nargs="+", type=int,
                   help=f"likewise (default: {BENCH_LANES})")
    p.add_argument("--bench-seconds", type=float, help="zmqrl bench --seconds, for the "
                   "bench and the scaling (default: 2, to fit 8 minutes; 5 is steadier)")
    p.add_argument("--bench-set", action="append", default=[], metavar="KEY=VALUE",
                   help=f"added to the bench topologies' overrides ({', '.join(BENCH_SETS)})")
    p.add_argument("--pong-topology", default="topologies/seed_atari.yaml",
                   help="the Pong run's topology")
    p.add_argument("--pong-set", action="append", default=[], metavar="KEY=VALUE",
                   help=f"added to the Pong run's overrides ({', '.join(PONG_SETS)}; "
                   "dry run: " + ", ".join(DRY_PONG_SETS) + ")")
    p.add_argument("--pong-seconds", type=float, help="the Pong run's --max-seconds "
                   "(default: 300; dry run: 20)")
    p.add_argument("--frame-skip", type=int, default=4, help="frames per Pong env step")
    p.add_argument("--scaling", nargs="+", type=int, help="actor processes of each scaling "
                   f"point (default: {' '.join(map(str, SCALING))}; dry run: 1 2)")
    p.add_argument("--scaling-topology", default="topologies/seed.yaml",
                   help="what the scaling measures")
    p.add_argument("--scaling-envs", type=int,
                   help="envs per actor (default: the bench's for that topology)")
    p.add_argument("--scaling-lanes", type=int,
                   help="lanes (default: the bench's for that topology)")
    args = p.parse_args(argv)
    if not args.out:
        p.error("--out or $OUT is needed")
    dry = args.dry_run
    args.device = args.device or ("cpu" if dry else "cuda")
    args.pong_seconds = args.pong_seconds or (20.0 if dry else 300.0)
    args.scaling = args.scaling or ([1, 2] if dry else SCALING)
    args.bench_seconds = args.bench_seconds or 2.0
    args.bench_actors = args.bench_actors or ([1] if dry else BENCH_ACTORS)
    args.bench_envs = args.bench_envs or ([16] if dry else BENCH_ENVS)
    args.bench_lanes = args.bench_lanes or BENCH_LANES
    count = len(args.bench_topologies)
    for what in ("actors", "envs", "lanes"):
        values = getattr(args, f"bench_{what}")
        if len(values) == 1:
            setattr(args, f"bench_{what}", values * count)
        elif len(values) != count:
            p.error(f"--bench-{what}: one value, or one per bench topology ({count})")
    return args


def main(argv: list[str] | None = None) -> int:
    if str(REPO) not in sys.path:  # run as benchmarks/gpu.py: zmqrl from this checkout
        sys.path.insert(0, str(REPO))
    args = parse_args(argv)
    run = Run(args)

    def interrupt(signum: int, _frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, interrupt)
    start = time.monotonic()
    code = 0
    try:
        run.results["host"] = host_info()
        for name in STEPS:
            if name in args.steps:
                run.step(name, getattr(run, name))
    except Interrupted as exc:
        run.results["interrupted"] = str(exc)
        code = 128 + signal.Signals[str(exc)].value
    finally:
        run.results["seconds"] = round(time.monotonic() - start, 1)
        run.results["failed"] = failed = [name for name, e in run.results["steps"].items()
                                          if e["status"] != "ok"]
        run.save()
        if not args.work:
            shutil.rmtree(run.work, ignore_errors=True)
    print(f"{run.out / 'gpu.json'}: {len(run.results['steps'])} step(s) in "
          f"{run.results['seconds']} s" + (f"; failed: {', '.join(failed)}" if failed else ""),
          flush=True)
    return code or (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
