"""``zmqrl bench``: SEED acting throughput against the no-network limit, in one run.

1. The limit: one process steps ``actors * envs`` environments in one gymnasium vector
   env and runs the same model on the whole batch every step. No sockets, no copies.
   It is measured before the topology and again after it, and the ratio is taken to
   their mean: this machine's speed drifts by tens of percent over a minute, and a
   drift during the run then cancels instead of landing in the ratio.
2. The topology: the same envs split over ``actors`` actor processes, one inference
   broker batching their requests and assembling unrolls, and a sink in the learner's
   place (so learning does not compete for the two cores; ``--with-learner`` keeps it).
   ``--pin`` gives each actor a core of its own (``cores``, :mod:`zmqrl.bus.cores`); by
   default the scheduler places every thread, as in every figure in BENCHMARKS.md.

Reported: both rates, their ratio, the broker's batch size (envs per forward pass), the
actors' request round-trip latency p50/p99, and where the time goes: the limit's split
between stepping envs and the model, and the CPU each node of the topology spends per env
step (from the ``cpu_cores`` column of its metrics). A node at ~1 core is the bottleneck;
one well below waits for its peers.
"""

from __future__ import annotations

import io
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from zmqrl.bus import cores
from zmqrl.parts.envs import env_spec, make_vector_env
from zmqrl.parts.models import build_model
from zmqrl.run.launch import StopConditions, Supervisor
from zmqrl.run.topology import load

WARMUP_S = 3.0  # after the first forward pass: first connections are not steady state
MAX_STARTUP_S = 60.0  # nodes that have not stepped by then will not


def no_network_limit(topo: Any, num_envs: int, seconds: float) -> dict[str, float]:
    """Env steps/s of one process stepping ``num_envs`` envs and the model on the batch,
    and its time per env step in each (us)."""
    torch.set_num_threads(1)
    spec = env_spec(topo.env)
    model = build_model(topo.model, spec, topo.seed)
    env = make_vector_env(topo.env, num_envs, topo.seed)
    obs, _ = env.reset(seed=topo.seed)
    steps, model_s, start = 0, 0.0, time.perf_counter()
    deadline = start + seconds
    now = start
    while now < deadline:
        action, _ = model.act(torch.from_numpy(obs))  # the env's dtype: the model converts
        acted = time.perf_counter()
        obs, *_ = env.step(action.numpy())
        model_s += acted - now
        now = time.perf_counter()
        steps += num_envs
    elapsed = now - start
    env.close()
    return {"steps_per_s": steps / elapsed, "model_us": model_s / steps * 1e6,
            "env_us": (elapsed - model_s) / steps * 1e6}


def _rows(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def actor_cores(actors: int, pin: bool) -> list[int] | None:
    """With ``pin``, the cores the actors are pinned to: the first ``actors`` this
    process may use (one must be left for the broker and the rest)."""
    if not pin:
        return None
    available = sorted(cores.available())
    if len(available) <= actors:
        raise ValueError(f"--pin needs more cores than actors: {actors} actor(s), "
                         f"{len(available)} core(s) available")
    return available[:actors]


def topology_rate(topology_path: str, actors: int, envs: int, seconds: float,
                  with_learner: bool, lanes: int = 1,
                  pinned: list[int] | None = None) -> dict[str, float]:
    overrides: dict[str, Any] = {"nodes": {"actor": {
        "replicas": actors, "args": {"envs": envs, "lanes": lanes}}}}
    if pinned:
        overrides["nodes"]["actor"]["cores"] = pinned
    if not with_learner:
        overrides["nodes"]["learner"] = {"kind": "sink"}
    topo = load(topology_path, overrides)
    with tempfile.TemporaryDirectory(prefix="zmqrl-bench-") as tmp:
        run_dir = Path(tmp)
        quiet = Console(file=io.StringIO())
        # The clock starts at the first env step: on a loaded machine the nodes' start-up
        # alone can take longer than a short measurement (max_seconds only caps it).
        Supervisor(topo, run_dir, StopConditions(
            max_stepping_seconds=seconds + WARMUP_S,
            max_seconds=seconds + WARMUP_S + MAX_STARTUP_S), quiet).run()
        rows = [r for r in _rows(run_dir / "metrics" / "broker.csv")
                if int(r["batches"] or 0) > 0]
        start = float(rows[0]["time_s"]) if rows else 0.0
        broker = [r for r in rows if float(r["time_s"]) >= start + WARMUP_S]
        if len(broker) < 2:
            raise RuntimeError("the broker reported too few metrics rows: is seconds too short?")
        first, last = broker[0], broker[-1]
        rate = ((int(last["env_steps"]) - int(first["env_steps"]))
                / (float(last["time_s"]) - float(first["time_s"])))
        actor_rows = [_rows(p)[-1] for p in sorted((run_dir / "metrics").glob("actor*.csv"))]
        cpu = {path.stem: _steady_mean(_rows(path), "cpu_cores")
               for path in sorted((run_dir / "metrics").glob("*.csv")) if path.stem != "run"}
        env = {path.stem: _steady_mean(_rows(path), "env_cores")
               for path in sorted((run_dir / "metrics").glob("actor*.csv"))}
        return {
            "steps_per_s": rate,
            "batch_envs_mean": statistics.mean(float(r["batch_envs_mean"]) for r in broker),
            "latency_p50_ms": round(statistics.median(float(r["latency_p50_ms"])
                                                      for r in actor_rows), 3),
            "latency_p99_ms": round(statistics.median(float(r["latency_p99_ms"])
                                                      for r in actor_rows), 3),
            "cpu_cores": {label: cores for label, cores in cpu.items() if cores is not None},
            "env_cores": {label: cores for label, cores in env.items() if cores is not None},
        }


def _steady_mean(rows: list[dict[str, str]], column: str) -> float | None:
    """A node's mean of ``column`` over its rows after the warm-up, but its last (the
    row written while stopping)."""
    steady = [float(r[column]) for r in rows[:-1]
              if float(r["time_s"]) >= WARMUP_S and r.get(column)]
    return round(statistics.mean(steady), 3) if steady else None


def run_bench(topology_path: str, actors: int, envs: int, seconds: float,
              with_learner: bool = False, json_path: str | None = None,
              lanes: int = 1, pin: bool = False) -> dict[str, Any]:
    topo = load(topology_path)
    pinned = actor_cores(actors, pin)
    console = Console(highlight=False)
    console.print(f"no-network limit: 1 process, {actors * envs} envs, {seconds:g}s ...")
    before = no_network_limit(topo, actors * envs, seconds)
    console.print(f"topology: {actors} actors x {envs} envs in {lanes} lane(s), "
                  f"{'learner' if with_learner else 'sink'}, actors "
                  + (f"pinned to cores {pinned}" if pinned else "not pinned") + " ...")
    result = topology_rate(topology_path, actors, envs, seconds, with_learner, lanes, pinned)
    console.print("no-network limit again ...")
    after = no_network_limit(topo, actors * envs, seconds)
    limit = {key: (before[key] + after[key]) / 2 for key in before}
    rate = result["steps_per_s"]
    report = {"env": topo.env["id"], "actors": actors, "envs_per_actor": envs, "lanes": lanes,
              "with_learner": with_learner, "actor_cores": pinned,
              "limit_steps_per_s": round(limit["steps_per_s"]),
              "limit_before_after": [round(before["steps_per_s"]), round(after["steps_per_s"])],
              "topology_steps_per_s": round(rate),
              "ratio": round(rate / limit["steps_per_s"], 3),
              "batch_envs_mean": round(result["batch_envs_mean"], 1),
              "latency_p50_ms": result["latency_p50_ms"],
              "latency_p99_ms": result["latency_p99_ms"],
              "limit_us_per_step": {"env": round(limit["env_us"], 2),
                                    "model": round(limit["model_us"], 2)},
              "cpu_cores": result["cpu_cores"],
              "env_cores": result["env_cores"],
              "cpu_us_per_step": {label: round(cores / rate * 1e6, 2)
                                  for label, cores in result["cpu_cores"].items()},
              "env_us_per_step": {label: round(cores / rate * 1e6, 2)
                                  for label, cores in result["env_cores"].items()}}
    console.print(
        f"limit {report['limit_steps_per_s']:,} steps/s (before {before['steps_per_s']:,.0f},"
        f" after {after['steps_per_s']:,.0f}) | topology "
        f"{report['topology_steps_per_s']:,} steps/s | ratio {report['ratio']:.2f} | "
        f"batch {report['batch_envs_mean']} envs | request latency p50 "
        f"{report['latency_p50_ms']} ms, p99 {report['latency_p99_ms']} ms"
    )
    split = report["limit_us_per_step"]
    console.print(
        f"CPU per env step: limit {split['env'] + split['model']:.1f} us (env {split['env']}"
        f" + model {split['model']}) | " + " | ".join(
            f"{label} {us} us" + (f" (env {report['env_us_per_step'][label]})"
                                  if label in report["env_us_per_step"] else "")
            + f" at {report['cpu_cores'][label]:.2f} cores"
            for label, us in report["cpu_us_per_step"].items()))
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    return report
