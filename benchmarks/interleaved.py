"""Two checkouts' SEED acting rates compared in one sitting, interleaved so that the
machine's drift cancels: ``zmqrl bench``'s ratio at 1 actor x 128 envs x 2 lanes (or
``--envs`` envs), split
into the two rates it divides, each measured side by side.

    python benchmarks/interleaved.py --before ../zmqrl-old [--windows 30] [--window-s 6]
        [--set nodes.actor.cores=[0]]   # extra --set for this checkout's topology only
        [--envs 1024]                   # the actor's envs, in both checkouts and limits

On a shared machine the speed of a core drifts by tens of percent over a minute, so two
``zmqrl bench`` runs a minute apart differ by more than the 1-2 % a change can make.
Here both checkouts run at once and take turns:

1. **Topology.** Each checkout runs ``zmqrl up topologies/seed.yaml`` (its own file,
   with 1 actor x 128 envs in 2 lanes and a sink in the learner's place, as the bench
   does). Every process of one run is stopped (SIGSTOP) while the other runs; after
   ``--settle-s`` the broker's ``env_steps`` is read from its metrics over ``--window-s``,
   then they swap. A stopped run uses no CPU, so each window measures one checkout
   alone.
2. **No-network limit.** The same with two child processes, each running the loop of
   ``zmqrl.run.bench.no_network_limit`` (written out below: that function runs for a fixed
   time) on its checkout's model and envs, each timing its own running windows.

Reported: per checkout the mean rate of each kind, and the ratios this/before of the
paired windows (mean, 95 % bootstrap interval). ``bench`` ratio this / before =
topology ratio / limit ratio.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETS = ["nodes.actor.replicas=1", "nodes.actor.args.lanes=2"]  # and the envs (--envs)

LIMIT_CHILD = r"""
import sys, time
import torch
try:
    from zmqrl.parts.envs import env_spec, make_vector_env
    from zmqrl.parts.models import build_model
    from zmqrl.run.topology import load
except ImportError:  # a checkout from before the layout by layer (issue 28)
    from zmqrl.envs import env_spec, make_vector_env
    from zmqrl.models import build_model
    from zmqrl.topology import load
torch.set_num_threads(1)
topo = load("topologies/seed.yaml")
model = build_model(topo.model, env_spec(topo.env), topo.seed)
envs = int(sys.argv[2])
env = make_vector_env(topo.env, envs, topo.seed)
obs, _ = env.reset(seed=topo.seed)
steps = 0
out = open(sys.argv[1], "a", buffering=1)
last = time.monotonic()
while True:
    action, _ = model.act(torch.from_numpy(obs))
    obs, *_ = env.step(action.numpy())
    steps += envs
    now = time.monotonic()
    if now - last >= 0.25:  # a stopped process writes nothing: windows stay its own
        out.write(f"{now} {steps}\n")
        last = now
"""


def _group_signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass


def _run_pids(supervisor: subprocess.Popen) -> list[int]:
    """The supervisor's process group and each node's (nodes run in their own)."""
    children = subprocess.run(["pgrep", "-P", str(supervisor.pid)], capture_output=True,
                              text=True).stdout.split()
    return [supervisor.pid, *map(int, children)]


def _last_row(path: Path) -> tuple[float, float] | None:
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return None
    for row in reversed(rows):
        if row.get("env_steps"):
            return float(row["time_s"]), float(row["env_steps"])
    return None


def _last_limit(path: Path) -> tuple[float, float] | None:
    try:
        lines = path.read_text().split("\n")
    except OSError:
        return None
    for line in reversed(lines):
        parts = line.split()
        if len(parts) == 2:
            return float(parts[0]), float(parts[1])
    return None


def _interleave(sides: dict[str, dict], windows: int, window_s: float, settle_s: float,
                read) -> dict[str, list[float]]:
    """Alternate the sides' process groups; each window's rate from ``read``."""
    rates: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    for k in range(2 * windows):
        run = order[k % 2] if (k // 2) % 2 == 0 else order[1 - k % 2]  # ABBA
        for name, side in sides.items():
            _group_signal(side["pids"](), signal.SIGCONT if name == run else signal.SIGSTOP)
        time.sleep(settle_s)
        first = read(sides[run])
        time.sleep(window_s)
        last = read(sides[run])
        if first and last and last[0] > first[0]:
            rates[run].append((last[1] - first[1]) / (last[0] - first[0]))
        print(f"window {k + 1}: {run} {rates[run][-1] if rates[run] else 0:,.0f} steps/s",
              flush=True)
    for side in sides.values():
        _group_signal(side["pids"](), signal.SIGCONT)
    return rates


def _paired(this: list[float], before: list[float]) -> tuple[float, float, float]:
    ratios = [a / b for a, b in zip(this, before, strict=False)]  # one extra window at most
    means = sorted(statistics.mean(random.choices(ratios, k=len(ratios)))
                   for _ in range(5000))
    return statistics.mean(ratios), means[124], means[-125]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout")
    parser.add_argument("--windows", type=int, default=30, help="windows per side")
    parser.add_argument("--window-s", type=float, default=6.0)
    parser.add_argument("--settle-s", type=float, default=2.5)
    parser.add_argument("--set", dest="sets", action="append", default=[],
                        help="KEY=VALUE for this checkout's topology only")
    parser.add_argument("--skip-limit", action="store_true")
    parser.add_argument("--before-python", type=Path,
                        help="the before checkout's Python (default: its .venv's if it has "
                             "one, else this one): its own installed entry points, where "
                             "the parts' module paths differ between the checkouts")
    parser.add_argument("--envs", type=int, default=128, help="the actor's envs (both sides)")
    args = parser.parse_args()
    checkouts = {"this": REPO, "before": args.before.resolve()}
    own = checkouts["before"] / ".venv" / "bin" / "python"
    pythons = {"this": sys.executable,
               "before": str(args.before_python or (own if own.exists() else sys.executable))}
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="zmqrl-interleaved-") as tmp:
        sides: dict[str, dict] = {}
        procs: list[subprocess.Popen] = []
        budget = 2 * args.windows * (args.window_s + args.settle_s) + 120
        for name, path in checkouts.items():
            run_dir = Path(tmp) / name
            sets = SETS + [f"nodes.actor.args.envs={args.envs}", "nodes.learner.kind=sink"] \
                + (args.sets if name == "this" else [])
            cmd = [pythons[name], "-m", "zmqrl.cli", "up", "topologies/seed.yaml",
                   "--run-dir", str(run_dir), "--max-seconds", str(budget)]
            for s in sets:
                cmd += ["--set", s]
            proc = subprocess.Popen(cmd, cwd=path, env={**os.environ, "PYTHONPATH": str(path)},
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
            procs.append(proc)
            sides[name] = {"pids": lambda proc=proc: _run_pids(proc),
                           "csv": run_dir / "metrics" / "broker.csv"}
        try:
            deadline = time.monotonic() + 120
            while not all(_last_row(s["csv"]) for s in sides.values()):
                if time.monotonic() > deadline:
                    raise SystemExit("the topologies did not start stepping within 120 s")
                time.sleep(0.5)
            time.sleep(3)
            results["topology"] = _interleave(
                sides, args.windows, args.window_s, args.settle_s,
                lambda side: _last_row(side["csv"]))
        finally:
            for proc in procs:
                _group_signal(_run_pids(proc), signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(timeout=60)
        if not args.skip_limit:
            sides, procs = {}, []
            for name, path in checkouts.items():
                out = Path(tmp) / f"limit-{name}.txt"
                proc = subprocess.Popen([pythons[name], "-c", LIMIT_CHILD, str(out),
                                         str(args.envs)], cwd=path,
                                        env={**os.environ, "PYTHONPATH": str(path)},
                                        start_new_session=True)
                procs.append(proc)
                sides[name] = {"pids": lambda proc=proc: [proc.pid], "out": out}
            try:
                while not all(_last_limit(s["out"]) for s in sides.values()):
                    time.sleep(0.5)
                results["limit"] = _interleave(
                    sides, max(4, args.windows // 2), args.window_s, 1.0,
                    lambda side: _last_limit(side["out"]))
            finally:
                for proc in procs:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    for kind, rates in results.items():
        mean, low, high = _paired(rates["this"], rates["before"])
        print(f"{kind}: this {statistics.mean(rates['this']):,.0f}, before "
              f"{statistics.mean(rates['before']):,.0f} steps/s; this/before {mean:.4f} "
              f"[{low:.4f}, {high:.4f}] over {min(map(len, rates.values()))} pairs")
    if len(results) == 2:
        topo = _paired(results["topology"]["this"], results["topology"]["before"])[0]
        limit = _paired(results["limit"]["this"], results["limit"]["before"])[0]
        print(f"bench ratio this/before: {topo / limit:.4f}")


if __name__ == "__main__":
    main()
