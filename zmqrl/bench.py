"""``zmqrl bench``: SEED acting throughput against the no-network limit, in one run.

1. The limit: one process steps ``actors * envs`` environments in one gymnasium vector
   env and runs the same model on the whole batch every step. No sockets, no copies.
2. The topology: the same envs split over ``actors`` actor processes, one inference
   broker batching their requests and assembling unrolls, and a sink in the learner's
   place (so learning does not compete for the two cores; ``--with-learner`` keeps it).

Reported: both rates, their ratio, the broker's batch size (envs per forward pass) and
the actors' request round-trip latency p50/p99.
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

from zmqrl.envs import env_spec, make_vector_env
from zmqrl.launch import StopConditions, Supervisor
from zmqrl.models import build_model
from zmqrl.topology import load

WARMUP_S = 3.0  # process start-up and first connections are not steady state


def no_network_limit(topo: Any, num_envs: int, seconds: float) -> float:
    """Env steps/s of one process stepping ``num_envs`` envs and the model on the batch."""
    torch.set_num_threads(1)
    spec = env_spec(topo.env)
    model = build_model(topo.model, spec, topo.seed)
    env = make_vector_env(topo.env, num_envs, topo.seed)
    obs, _ = env.reset(seed=topo.seed)
    steps, start = 0, time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        action, _ = model.act(torch.from_numpy(obs))  # the env's dtype: the model converts
        obs, *_ = env.step(action.numpy())
        steps += num_envs
    elapsed = time.perf_counter() - start
    env.close()
    return steps / elapsed


def _rows(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def topology_rate(topology_path: str, actors: int, envs: int, seconds: float,
                  with_learner: bool, lanes: int = 1) -> dict[str, float]:
    overrides: dict[str, Any] = {"nodes": {"actor": {
        "replicas": actors, "args": {"envs": envs, "lanes": lanes}}}}
    if not with_learner:
        overrides["nodes"]["learner"] = {"kind": "sink"}
    topo = load(topology_path, overrides)
    with tempfile.TemporaryDirectory(prefix="zmqrl-bench-") as tmp:
        run_dir = Path(tmp)
        quiet = Console(file=io.StringIO())
        Supervisor(topo, run_dir, StopConditions(max_seconds=seconds + WARMUP_S), quiet).run()
        broker = [r for r in _rows(run_dir / "metrics" / "broker.csv")
                  if float(r["time_s"]) >= WARMUP_S and int(r["batches"] or 0) > 0]
        if len(broker) < 2:
            raise RuntimeError("the broker reported too few metrics rows: is seconds too short?")
        first, last = broker[0], broker[-1]
        rate = ((int(last["env_steps"]) - int(first["env_steps"]))
                / (float(last["time_s"]) - float(first["time_s"])))
        actor_rows = [_rows(p)[-1] for p in sorted((run_dir / "metrics").glob("actor*.csv"))]
        return {
            "steps_per_s": rate,
            "batch_envs_mean": statistics.mean(float(r["batch_envs_mean"]) for r in broker),
            "latency_p50_ms": round(statistics.median(float(r["latency_p50_ms"])
                                                      for r in actor_rows), 3),
            "latency_p99_ms": round(statistics.median(float(r["latency_p99_ms"])
                                                      for r in actor_rows), 3),
        }


def run_bench(topology_path: str, actors: int, envs: int, seconds: float,
              with_learner: bool = False, json_path: str | None = None,
              lanes: int = 1) -> dict[str, Any]:
    topo = load(topology_path)
    console = Console(highlight=False)
    console.print(f"no-network limit: 1 process, {actors * envs} envs, {seconds:g}s ...")
    limit = no_network_limit(topo, actors * envs, seconds)
    console.print(f"topology: {actors} actors x {envs} envs in {lanes} lane(s), "
                  f"{'learner' if with_learner else 'sink'} ...")
    result = topology_rate(topology_path, actors, envs, seconds, with_learner, lanes)
    report = {"env": topo.env["id"], "actors": actors, "envs_per_actor": envs, "lanes": lanes,
              "with_learner": with_learner, "limit_steps_per_s": round(limit),
              "topology_steps_per_s": round(result["steps_per_s"]),
              "ratio": round(result["steps_per_s"] / limit, 3),
              "batch_envs_mean": round(result["batch_envs_mean"], 1),
              "latency_p50_ms": result["latency_p50_ms"],
              "latency_p99_ms": result["latency_p99_ms"]}
    console.print(
        f"limit {report['limit_steps_per_s']:,} steps/s | topology "
        f"{report['topology_steps_per_s']:,} steps/s | ratio {report['ratio']:.2f} | "
        f"batch {report['batch_envs_mean']} envs | request latency p50 "
        f"{report['latency_p50_ms']} ms, p99 {report['latency_p99_ms']} ms"
    )
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    return report
