"""``zmqrl bench``: SEED acting throughput against the no-network limit, in one run.

1. The limit: one process steps ``actors * envs`` environments in one gymnasium vector
   env and acts on the whole batch every step through the topology's own behaviour
   (:mod:`zmqrl.parts.acting`: the same model, exploration and trajectory bookkeeping
   as its broker or local actors). No sockets, no copies.
   It is measured before the topology and again after it, and the ratio is taken to
   their mean: this machine's speed drifts by tens of percent over a minute, and a
   drift during the run then cancels instead of landing in the ratio.
2. The topology: the same envs split over ``actors`` actor processes (its node named
   ``actor``), acting through its inference broker (SEED) or locally (IMPALA, Ape-X),
   and a sink in the learner's place (so learning does not compete for the two cores;
   ``--with-learner`` keeps it). Where the actors feed a replay, it stays, without its
   samples-per-insert ratio (nothing samples it). Topologies whose actors are not of
   kind ``actor``, or ship gradients (A3C), are refused with the reason.
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

import numpy as np
import torch
from rich.console import Console

from zmqrl.bus import cores
from zmqrl.parts.acting import ActingSetup, act_batched, behaviour_for, final_obs
from zmqrl.parts.envs import env_action, env_spec, make_vector_env
from zmqrl.parts.models import build_model
from zmqrl.run.launch import StopConditions, Supervisor
from zmqrl.run.topology import Topology, from_dict, load

WARMUP_S = 3.0  # after the first forward pass: first connections are not steady state
MAX_STARTUP_S = 60.0  # nodes that have not stepped by then will not


def no_network_limit(topo: Any, num_envs: int, seconds: float) -> dict[str, float]:
    """Env steps/s of one process stepping ``num_envs`` envs and acting on the batch
    through the topology's behaviour, and its time per env step in each (us): the
    envs' step, and the rest (the forward pass and the behaviour's bookkeeping)."""
    torch.set_num_threads(1)
    spec = env_spec(topo.env)
    model = build_model(topo.model, spec, topo.seed, algo=topo.algo_config)
    model.eval()
    cls = behaviour_for(topo.parts_config, acting=topo.acting)
    if not cls.steps_envs:
        raise ValueError(f"zmqrl bench measures env steps; the behaviour {cls.__name__} "
                         "evaluates a search's leaves")
    behaviour = cls(ActingSetup(spec, model, topo.algo_config, seed=topo.seed), num_envs)
    env = make_vector_env(topo.env, num_envs, topo.seed)
    obs, _ = env.reset(seed=topo.seed)
    behaviour.observe(obs.astype(spec.obs_dtype, copy=False))
    steps, env_s, start = 0, 0.0, time.perf_counter()
    deadline = start + seconds
    now = start
    while now < deadline:
        (action,) = act_batched(model, [behaviour], 0)
        acted = time.perf_counter()
        obs, reward, terminated, truncated, info = env.step(env_action(action, spec))
        stepped = time.perf_counter()
        cut = truncated & ~terminated
        behaviour.outcome(reward.astype(np.float32, copy=False), terminated | truncated, cut,
                          final_obs(info, cut, spec.obs_shape, spec.obs_dtype))
        behaviour.observe(obs.astype(spec.obs_dtype, copy=False))
        behaviour.take()  # what the topology would ship
        env_s += stepped - acted
        now = time.perf_counter()
        steps += num_envs
    elapsed = now - start
    env.close()
    return {"steps_per_s": steps / elapsed, "model_us": (elapsed - env_s) / steps * 1e6,
            "env_us": env_s / steps * 1e6}


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


def _bench_topology(topology_path: str, actors: int, envs: int, with_learner: bool,
                    lanes: int, pinned: list[int] | None) -> tuple[Topology, str | None]:
    """The topology to run, and the node whose rows count its env steps: its inference
    broker, or None where the actors act locally (their own rows count). Raises
    ValueError, with the reason, for a topology the bench cannot measure."""
    topo = load(topology_path)
    actor = topo.nodes.get("actor")
    if actor is None or actor.kind != "actor":
        raise ValueError(f"{topology_path}: zmqrl bench runs the node named 'actor' (kind: "
                         "actor); this topology has "
                         + ("none" if actor is None else f"one of {actor.kind or 'impl/command'}"))
    remote = actor.args.get("policy", "remote") == "remote"
    if not remote and "experience" not in actor.links:
        raise ValueError(f"{topology_path}: its actors ship gradients (A3C), which zmqrl "
                         "bench does not measure: it measures acting through a broker or "
                         "locally into a learner or a replay")
    counted = actor.links["policy"].partition(".")[0] if remote else None
    raw = topo.to_dict()
    node = raw["nodes"]["actor"]
    node["replicas"] = actors
    node.setdefault("args", {}).update(envs=envs, lanes=lanes)
    if pinned:
        node["cores"] = pinned
    if not with_learner:
        feeder = raw["nodes"][counted] if remote else node
        given = feeder.get("links", {}).get("experience", "")
        for target in [given] if isinstance(given, str) else given:  # a many-link: each
            consumer = target.partition(".")[0]
            if raw["nodes"].get(consumer, {}).get("kind") == "replay":
                # nothing samples it now: no ratio to wait for
                raw["nodes"][consumer].setdefault("args", {}).update(samples_per_insert=None,
                                                                     error_buffer=None)
        raw["nodes"]["learner"] = {"kind": "sink"}
    return from_dict(raw, topology_path), counted


def _rate(rows: list[dict[str, str]]) -> float:
    """Env steps/s over rows from the first one after the warm-up to the last."""
    first, last = rows[0], rows[-1]
    return ((int(last["env_steps"]) - int(first["env_steps"]))
            / (float(last["time_s"]) - float(first["time_s"])))


def topology_rate(topology_path: str, actors: int, envs: int, seconds: float,
                  with_learner: bool, lanes: int = 1,
                  pinned: list[int] | None = None) -> dict[str, Any]:
    topo, counted = _bench_topology(topology_path, actors, envs, with_learner, lanes, pinned)
    with tempfile.TemporaryDirectory(prefix="zmqrl-bench-") as tmp:
        run_dir = Path(tmp)
        quiet = Console(file=io.StringIO())
        # The clock starts at the first env step: on a loaded machine the nodes' start-up
        # alone can take longer than a short measurement (max_seconds only caps it).
        Supervisor(topo, run_dir, StopConditions(
            max_stepping_seconds=seconds + WARMUP_S,
            max_seconds=seconds + WARMUP_S + MAX_STARTUP_S), quiet).run()
        metrics = run_dir / "metrics"
        actor_rows = [_rows(p) for p in sorted(metrics.glob("actor*.csv"))]
        if counted is not None:  # the broker acts for every env: its count is the rate
            rows = [r for r in _rows(metrics / f"{counted}.csv") if int(r["batches"] or 0) > 0]
            steady = [_steady(rows)]
        else:  # each actor acts for its own envs: their rates add up
            steady = [_steady([r for r in rows if int(r["env_steps"] or 0) > 0])
                      for rows in actor_rows]
        if any(len(rows) < 2 for rows in steady):
            raise RuntimeError("the nodes reported too few metrics rows: is seconds too short?")
        rate = sum(_rate(rows) for rows in steady)
        cpu = {path.stem: _steady_mean(_rows(path), "cpu_cores")
               for path in sorted(metrics.glob("*.csv")) if path.stem != "run"}
        env = {path.stem: _steady_mean(_rows(path), "env_cores")
               for path in sorted(metrics.glob("actor*.csv"))}
        last = [rows[-1] for rows in actor_rows if rows]
        remote = counted is not None
        return {
            "steps_per_s": rate,
            # a local actor's forward pass is over its own envs
            "batch_envs_mean": statistics.mean(float(r["batch_envs_mean"]) for r in steady[0])
            if remote else float(envs),
            "latency_p50_ms": round(statistics.median(float(r["latency_p50_ms"])
                                                      for r in last), 3) if remote else None,
            "latency_p99_ms": round(statistics.median(float(r["latency_p99_ms"])
                                                      for r in last), 3) if remote else None,
            "cpu_cores": {label: cores for label, cores in cpu.items() if cores is not None},
            "env_cores": {label: cores for label, cores in env.items() if cores is not None},
        }


def _steady(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows after the warm-up, counted from the first one that acted."""
    start = float(rows[0]["time_s"]) if rows else 0.0
    return [r for r in rows if float(r["time_s"]) >= start + WARMUP_S]


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
    _bench_topology(topology_path, actors, envs, with_learner, lanes, pinned)  # refuse early
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
        f"batch {report['batch_envs_mean']} envs"
        + (f" | request latency p50 {report['latency_p50_ms']} ms, p99 "
           f"{report['latency_p99_ms']} ms" if report["latency_p50_ms"] is not None else "")
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
