"""MuZero on the bus: what BENCHMARKS.md records for topologies/muzero.yaml (issue 32).

    python benchmarks/muzero.py throughput [--seconds 20] [--set ...]
    python benchmarks/muzero.py cartpole [--seeds 1 2 3] [--budget 600] [--target 475]
    python benchmarks/muzero.py steps [--steps 200000] [--set algo.num_simulations=4]
    python benchmarks/muzero.py minatar [--seconds 300]
    python benchmarks/muzero.py reanalyse [--seconds 300] [--seed 1]
    python benchmarks/muzero.py versus [--seeds 1 2 3] [--budget 300] [--set ...]
        [--arm NAME=KEY=VALUE,...]
    python benchmarks/muzero.py minatar-steps [--seeds 1 2 3] [--steps 100000]

``throughput``: search simulations per second of the topology's search (its model,
simulations, envs in flight), (1) in this process, the model called for one query at a
time (a search that does not batch), (2) in this process, a round's queries of every
env in one call, (3) through the bus: the topology's actors and broker (no learner or
replay), the broker answering every actor's round in one forward pass and keeping the
latents.

``cartpole``: ``zmqrl up topologies/muzero.yaml`` per seed until the mean return of the
last 20 episodes reaches ``--target`` or ``--budget`` seconds pass (whole process: start
and imports count); prints the time it took.

``steps``: wall seconds per 1,000 env steps in each 10 % of the way from ``--from`` to
``--steps`` env steps of one run (the replay growing all the way: its capacity is set
above ``--steps``), and the learner's updates per second in the same windows: whether
the replay's growth slows acting or learning.

``minatar``: muzero_minatar.yaml without and with a reanalyse node, ``--seconds`` each
(equal wall time), then seed_minatar.yaml to the env steps MuZero's first run reached
(equal env steps: MuZero's claim is sample efficiency); the mean returns.

``reanalyse``: muzero.yaml with and without a reanalyse node for ``--seconds`` each
(alternating), the same seed; the return of the last 20 episodes at the end.

``versus``: per seed, ``muzero.yaml`` and then ``seed.yaml`` until the mean return of the
last 100 episodes reaches ``--target`` (or ``--budget`` seconds pass): the time and env
steps each took, then the medians and MuZero's env steps against SEED's (the issue's
sample-efficiency goal: at most half). SEED's time in the same sitting is the machine's
gauge.

``minatar-steps``: per seed, ``muzero_minatar.yaml`` and ``seed_minatar.yaml`` for the same
``--steps`` env steps: the mean return of the last 100 episodes at the end.

Every line says the machine's load average: on a shared machine that is what makes
figures comparable.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
TOPOLOGY = REPO / "topologies" / "muzero.yaml"
REANALYSE = ["algo.reanalyse=true", "nodes.reanalyse.kind=reanalyse",
             "nodes.reanalyse.links.replay=replay.sample",
             "nodes.reanalyse.links.params=learner.params"]


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def zmqrl_up(topology: Path | str, run_dir: Path, *extra: str, sets: list[str] = ()
             ) -> float:
    """Run ``zmqrl up`` to its end; return its wall seconds (start-up included)."""
    args = [sys.executable, "-m", "zmqrl.cli", "up", str(topology), "--run-dir",
            str(run_dir), *extra]
    for item in sets:
        args += ["--set", item]
    start = time.perf_counter()
    subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def rows(run_dir: Path, label: str) -> list[dict[str, str]]:
    path = run_dir / "metrics" / f"{label}.csv"
    return list(csv.DictReader(open(path))) if path.exists() else []


def run_rows(run_dir: Path) -> list[tuple[float, float, float, float, float]]:
    """(seconds since the run's start, env steps, return(20), return(100), updates) of
    each of the supervisor's rows (runs/<run>/metrics/run.csv)."""
    def num(text: str | None) -> float:
        return float(text) if text not in (None, "", "nan") else float("nan")

    return [(num(r["time_s"]), num(r["env_steps"]), num(r["return_mean_20"]),
             num(r["return_mean_100"]), num(r["updates"])) for r in rows(run_dir, "run")]


# ----- throughput ----------------------------------------------------------------------
def in_process(model: torch.nn.Module, obs: np.ndarray, params, one_by_one: bool,
               seconds: float) -> float:
    """Simulations per second of searches from ``obs`` in this process."""
    from zmqrl.parts.muzero.models import numpy_inference
    from zmqrl.parts.muzero.search import search

    initial, recurrent = numpy_inference(model)
    rng = np.random.default_rng(0)
    search(initial, recurrent, obs, params, rng, one_by_one)  # warm-up
    start, sims = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        search(initial, recurrent, obs, params, rng, one_by_one)
        sims += len(obs) * params.num_simulations
    return sims / (time.perf_counter() - start)


def _status(run_dir: Path) -> dict:
    out = {}
    for p in (run_dir / "status").glob("*.json"):
        try:
            out[p.stem] = json.loads(p.read_text())
        except ValueError:
            pass  # mid-write
    return out


@contextmanager
def _up(topology: dict, run_dir: Path) -> Iterator[subprocess.Popen]:
    path = run_dir.parent / f"{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(topology))
    proc = subprocess.Popen([sys.executable, "-m", "zmqrl.cli", "up", str(path), "--run-dir",
                             str(run_dir)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait()


def through_broker(raw: dict, seconds: float) -> tuple[float, float]:
    """(simulations per second of all actors, queries per broker forward pass)."""
    broker = {k: v for k, v in raw["nodes"]["broker"].items() if k != "links"}
    topo = {**raw, "nodes": {"broker": broker,
                             "actor": {**raw["nodes"]["actor"],
                                       "links": {"policy": "broker.policy"}}}}
    actors = topo["nodes"]["actor"].get("replicas", 1)
    labels = [f"actor.{i}" for i in range(actors)] if actors > 1 else ["actor"]

    def sims() -> float | None:
        status = _status(run_dir)
        try:
            found = [int(status[label]["row"]["simulations"]) for label in labels]
        except KeyError:
            return None
        return float(sum(found)) if min(found) > 0 else None

    with tempfile.TemporaryDirectory(prefix="zmqrl-mz-") as tmp:
        run_dir = Path(tmp) / "run"
        with _up(topo, run_dir) as proc:
            while sims() is None:
                if proc.poll() is not None:
                    raise RuntimeError(f"zmqrl up of the actors and broker ended: "
                                       f"{proc.returncode}")
                time.sleep(0.5)
            time.sleep(5.0)  # past the first, slow forward passes
            first, t0 = sims(), time.perf_counter()
            time.sleep(seconds)
            last, t1 = sims(), time.perf_counter()
        batch = [float(r["batch_envs_mean"]) for r in rows(run_dir, "broker")
                 if float(r["batch_envs_mean"] or 0) > 0]
    return (last - first) / (t1 - t0), float(np.mean(batch[len(batch) // 3:]))


def throughput(args: argparse.Namespace) -> None:
    from zmqrl.cli import _overrides
    from zmqrl.parts import algo_config
    from zmqrl.parts.envs import env_spec, make_vector_env
    from zmqrl.parts.models import build_model
    from zmqrl.parts.muzero.search import SearchParams
    from zmqrl.run.topology import merge

    torch.set_num_threads(1)
    raw = merge(yaml.safe_load(TOPOLOGY.read_text()), _overrides(tuple(args.set)))
    actor = raw["nodes"]["actor"]
    envs = actor.get("replicas", 1) * actor["args"]["envs"]  # (split over its lanes)
    model = build_model(raw["model"], env_spec(raw["env"]), seed=0).eval()
    params = SearchParams.of(algo_config.parse(raw["algo"]))
    env = make_vector_env(raw["env"], envs, 0)
    obs = env.reset(seed=0)[0].astype(np.float32)
    print(f"{raw['env']['id']}, {params.num_simulations} simulations a move, {envs} envs in "
          f"flight ({load()})", flush=True)
    one = in_process(model, obs, params, True, args.seconds)
    print(f"in-process, one query per call: {one:,.0f} simulations/s ({load()})", flush=True)
    batched = in_process(model, obs, params, False, args.seconds)
    print(f"in-process, a round's queries per call: {batched:,.0f} simulations/s "
          f"({load()})", flush=True)
    bus, per_pass = through_broker(raw, args.seconds)
    print(f"bus: {bus:,.0f} simulations/s, {per_pass:.1f} queries per forward pass "
          f"({load()})")
    print(f"bus / one by one: {bus / one:.2f}x; in-process batched / one by one: "
          f"{batched / one:.2f}x")


# ----- learning ------------------------------------------------------------------------
def cartpole(args: argparse.Namespace) -> None:
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix="zmqrl-mz-") as tmp:
            run_dir = Path(tmp) / "run"
            wall = zmqrl_up(TOPOLOGY, run_dir, "--max-seconds", str(args.budget),
                            "--target-return", str(args.target), "--target-window", "20",
                            sets=[f"seed={seed}", *args.set])
            run = run_rows(run_dir)
            reached = next((r for r in run if r[2] >= args.target), None)
            last = run[-1]
            print(f"seed {seed}: " + (f"return(20) {args.target:g} at {reached[0]:.0f} s, "
                                      f"{reached[1]:,.0f} env steps, {reached[4]:.0f} updates"
                                      if reached else f"not reached in {wall:.0f} s; last "
                                      f"return(20) {last[2]:.1f}")
                  + f" ({load()})", flush=True)
            if args.keep:
                keep_run(run_dir, Path(args.keep) / f"muzero-seed{seed}")


def steps(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="zmqrl-mz-") as tmp:
        run_dir = Path(tmp) / "run"
        sets = [f"nodes.replay.args.capacity={int(args.steps * 1.25)}", *args.set]
        wall = zmqrl_up(TOPOLOGY, run_dir, "--max-steps", str(args.steps), sets=sets)
        actor = [(float(r["time_s"]), float(r["env_steps"]))
                 for label in ("actor.0",) for r in rows(run_dir, label) if r.get("env_steps")]
        learner = [(float(r["time_s"]), float(r["updates"]))
                   for r in rows(run_dir, "learner") if r.get("updates")]
        replicas = len(list((run_dir / "metrics").glob("actor.*.csv")))
        print(f"{args.steps:,} env steps in {wall:.0f} s ({load()}); sets {sets}")
        t, s = np.array(actor).T
        s = s * replicas  # the replicas step alike: one's count x replicas
        lt, lu = np.array(learner).T
        edges = np.linspace(args.start, args.steps, 11)
        per_k, ups = [], []
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            t_lo, t_hi = np.interp([lo, hi], s, t)
            per_k.append((t_hi - t_lo) / (hi - lo) * 1000)
            u_lo, u_hi = np.interp([t_lo, t_hi], lt, lu)
            ups.append((u_hi - u_lo) / (t_hi - t_lo))
            print(f"  {lo:>9,.0f}-{hi:>9,.0f} env steps: {per_k[-1]:.2f} s per 1k env steps, "
                  f"{ups[-1]:.1f} updates/s")
        print(f"s per 1k env steps: max/min {max(per_k) / min(per_k):.3f}; last/first "
              f"{per_k[-1] / per_k[0]:.3f}; updates/s max/min {max(ups) / min(ups):.3f}")


def minatar(args: argparse.Namespace) -> None:
    """muzero_minatar.yaml without and with a reanalyse node, ``--seconds`` each (equal
    wall time), then seed_minatar.yaml to the env steps the first reached (equal env
    steps)."""
    muzero = REPO / "topologies" / "muzero_minatar.yaml"
    reached = 0.0
    for name, topology, extra, sets in (
            ("muzero_minatar", muzero, ["--max-seconds", str(args.seconds)], []),
            ("muzero_minatar + reanalyse", muzero, ["--max-seconds", str(args.seconds)],
             REANALYSE),
            ("seed_minatar", REPO / "topologies" / "seed_minatar.yaml", None, [])):
        with tempfile.TemporaryDirectory(prefix="zmqrl-mz-") as tmp:
            run_dir = Path(tmp) / "run"
            if extra is None:  # the same env steps as MuZero's first run
                extra = ["--max-steps", str(int(reached))]
            wall = zmqrl_up(topology, run_dir, *extra, sets=[f"seed={args.seed}", *sets])
            run = run_rows(run_dir)
            last = run[-1]
            reached = reached or last[1]
            half = [r[3] for r in run if r[1] <= last[1] / 2]
            revised = [r for r in rows(run_dir, "replay") if r.get("revised")]
            print(f"{name}: {last[1]:,.0f} env steps in {wall:.0f} s, {last[4]:.0f} updates; "
                  f"return(100) {last[3]:.2f} at the end, "
                  f"{half[-1] if half else float('nan'):.2f} at half the env steps"
                  + (f"; {revised[-1]['revised']} items revised" if revised and
                     revised[-1]["revised"] != "0" else "") + f" ({load()})", flush=True)


def reanalyse(args: argparse.Namespace) -> None:
    for repeat in range(args.repeats):
        arms = [("without", []), ("with", REANALYSE)]
        for name, sets in (arms if repeat % 2 == 0 else arms[::-1]):
            with tempfile.TemporaryDirectory(prefix="zmqrl-mz-") as tmp:
                run_dir = Path(tmp) / "run"
                zmqrl_up(TOPOLOGY, run_dir, "--max-seconds", str(args.seconds),
                         sets=[f"seed={args.seed}", *sets, *args.set])
                last = run_rows(run_dir)[-1]
                revised = [r for r in rows(run_dir, "replay") if r.get("revised")]
                print(f"{name} reanalyse: return(20) {last[2]:.1f} at {args.seconds:g} s, "
                      f"{last[1]:,.0f} env steps, {last[4]:.0f} updates, "
                      f"{revised[-1]['revised'] if revised else 0} items revised ({load()})",
                      flush=True)


def keep_run(run_dir: Path, dest: Path) -> None:
    """A copy of a finished run for ``zmqrl plot`` (its sockets and locks left out)."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns("ipc", "locks"))


def _to_target(topology: Path, seed: int, args: argparse.Namespace, sets: list[str],
               keep: str) -> tuple[float | None, float | None, float, float]:
    """(seconds, env steps) at which return(100) first reached the target (None: not
    within the budget), and the last return(100) and env steps."""
    with tempfile.TemporaryDirectory(prefix="zmqrl-mz-") as tmp:
        run_dir = Path(tmp) / "run"
        zmqrl_up(topology, run_dir, "--max-seconds", str(args.budget), "--target-return",
                 str(args.target), sets=[f"seed={seed}", *sets])
        run = run_rows(run_dir)
        if args.keep:
            keep_run(run_dir, Path(args.keep) / keep)
    reached = next((r for r in run if r[3] >= args.target), None)
    last = run[-1]
    return (reached[0] if reached else None, reached[1] if reached else None, last[3],
            last[1])


def _arm(text: str) -> tuple[str, list[str]]:
    """``NAME=KEY=VALUE,KEY=VALUE`` -> (NAME, the --set list)."""
    name, _, sets = text.partition("=")
    return name, [s for s in sets.split(",") if s]


def versus(args: argparse.Namespace) -> None:
    arms = [("muzero", TOPOLOGY, args.set),
            *((name, TOPOLOGY, [*args.set, *sets]) for name, sets in map(_arm, args.arm)),
            ("seed", REPO / "topologies" / "seed.yaml", [])]
    found: dict[str, list[float]] = {name: [] for name, _, _ in arms}
    for seed in args.seeds:
        for name, topology, sets in arms:
            t, steps, last, total = _to_target(topology, seed, args, sets, f"{name}-seed{seed}")
            found[name].append(steps if steps is not None else float("inf"))
            print(f"seed {seed} {name}: " + (
                f"return(100) {args.target:g} at {t:.0f} s, {steps:,.0f} env steps"
                if steps is not None else
                f"not reached in {args.budget:g} s: return(100) {last:.1f} at "
                f"{total:,.0f} env steps") + f" ({load()})", flush=True)
    sd = float(np.median(found["seed"]))
    for name, _, sets in arms[:-1]:
        mz = float(np.median(found[name]))
        print(f"median env steps to {args.target:g}: {name} {mz:,.0f}, seed {sd:,.0f}; "
              f"{name}/seed {mz / sd:.2f} (goal <= 0.5); sets {sets}")


def minatar_steps(args: argparse.Namespace) -> None:
    for seed in args.seeds:
        for name in ("muzero_minatar", "seed_minatar"):
            with tempfile.TemporaryDirectory(prefix="zmqrl-mz-") as tmp:
                run_dir = Path(tmp) / "run"
                own = args.muzero_set if name == "muzero_minatar" else []
                wall = zmqrl_up(REPO / "topologies" / f"{name}.yaml", run_dir, "--max-steps",
                                str(args.steps), sets=[f"seed={seed}", *args.set, *own])
                last = run_rows(run_dir)[-1]
                print(f"seed {seed} {name}: return(100) {last[3]:.2f} at {last[1]:,.0f} env "
                      f"steps, {wall:.0f} s ({load()})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("throughput")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--set", action="append", default=[])
    p = sub.add_parser("cartpole")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--budget", type=float, default=600.0)
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--keep", help="copy each run directory here (for zmqrl plot)")
    p.add_argument("--set", action="append", default=[])
    p = sub.add_parser("steps")
    p.add_argument("--steps", type=int, default=200_000)
    p.add_argument("--from", dest="start", type=int, default=20_000)
    p.add_argument("--set", action="append", default=[])
    p = sub.add_parser("minatar")
    p.add_argument("--seconds", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=1)
    p = sub.add_parser("reanalyse")
    p.add_argument("--seconds", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--set", action="append", default=[])
    p = sub.add_parser("versus")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--budget", type=float, default=300.0)
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--keep", help="copy each run directory here (for zmqrl plot)")
    p.add_argument("--set", action="append", default=[], help="for muzero.yaml")
    p.add_argument("--arm", action="append", default=[], metavar="NAME=KEY=VALUE,...",
                   help="another muzero.yaml arm with these --sets (run after the first)")
    p = sub.add_parser("minatar-steps")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--set", action="append", default=[], help="for both topologies")
    p.add_argument("--muzero-set", action="append", default=[],
                   help="for muzero_minatar.yaml only")
    args = parser.parse_args()
    {"throughput": throughput, "cartpole": cartpole, "steps": steps, "minatar": minatar,
     "reanalyse": reanalyse, "versus": versus,
     "minatar-steps": minatar_steps}[args.what](args)


if __name__ == "__main__":
    main()
