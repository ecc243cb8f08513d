"""CPU per request of the SEED hot path, in one process: the inference broker's and the
remote actor's handling of one 64-env CartPole message, nodes as they run (set up from
``topologies/seed.yaml``, sockets opened), sends stubbed out.

    python benchmarks/request_cpu.py [--rounds 5]
    python benchmarks/request_cpu.py --checkout ../old-zmqrl   # another checkout's code

* broker: decode one ``step`` as the node's loop does, ``on_policy`` (the check against
  its declaration, the behaviour's bookkeeping), ``after_poll`` (one forward pass, the
  ``act`` reply encoded); and, of that, the part before the reply is handed to ``send``
  (what the waiting actor pays: work after the send overlaps its stepping);
* actor: decode one ``act``, step the lane's 64 envs, encode the next ``step``.

Each figure is the best of 9 repeats of 1,000 requests, in CPU time of this process
(``time.process_time``), so other processes on a busy machine inflate it less than wall
time would. ``--checkout`` runs the same measurement, in a child process, on another
checkout's ``zmqrl``/``nodes`` (the APIs used here exist since the node runtime's first
version), alternating with this one for ``--rounds`` rounds: a before/after in one
sitting. The spine's comparison in BENCHMARKS.md was made so.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ENVS = 64


def _node(raw: dict, name: str, tmp: Path) -> Any:
    from zmqrl.bus.endpoints import Endpoints
    from zmqrl.bus.node import NodeContext
    from zmqrl.run.topology import from_dict, load_class

    topo = from_dict(raw)
    spec = topo.nodes[name]
    return load_class(spec.target)(NodeContext(topo, spec, 0, tmp, Endpoints(topo, tmp)))


def _best_us(fn: Any, number: int = 1000) -> float:
    for _ in range(number // 4):
        fn()  # warm-up: first forward passes, allocator, caches
    return min(timeit.repeat(fn, number=number, repeat=9, timer=time.process_time)) \
        / number * 1e6


def measure() -> dict[str, float]:
    """(in this process, the code on sys.path) CPU us per broker request and actor step."""
    import numpy as np
    import yaml

    from zmqrl.bus import wire
    raw = yaml.safe_load((Path.cwd() / "topologies" / "seed.yaml").read_text())
    raw["nodes"]["learner"] = {"kind": "sink"}
    raw["nodes"]["actor"].update(replicas=1)
    raw["nodes"]["actor"].setdefault("args", {}).update(envs=2 * ENVS, lanes=2)
    out = {}
    with tempfile.TemporaryDirectory(prefix="zmqrl-request-cpu-") as tmp:
        broker = _node(raw, "broker", Path(tmp))
        broker._open_sockets()
        broker.setup()
        broker.send = lambda *_args, **_kwargs: True
        rng = np.random.default_rng(0)
        steps = [[bytes(f) for f in wire.encode(wire.STEP, {
            "obs": rng.standard_normal((ENVS, 4)).astype(np.float32),
            "reward": np.ones(ENVS, np.float32), "done": rng.random(ENVS) < 0.05}, seq=i)]
            for i in range(16)]
        turn = iter(range(1 << 62))

        def serve() -> None:
            frames = steps[next(turn) % len(steps)]
            broker.on_policy([b"\x00peer"], wire.decode(frames))
            broker.after_poll()

        out["broker_us"] = _best_us(serve)

        # CPU from the step's frames to the reply's send: the broker's share of the
        # actor's round trip. Median of 1,000 requests, best of 9.
        started, to_reply = 0.0, []

        def stamp(*_args: Any, **_kwargs: Any) -> bool:
            to_reply.append(time.process_time() - started)
            return True

        broker.send = stamp
        medians = []
        for _ in range(9):
            to_reply.clear()
            for _ in range(1000):
                started = time.process_time()
                serve()
            medians.append(statistics.median(to_reply))
        out["broker_reply_us"] = min(medians) * 1e6
        for sock in broker.sockets.values():
            sock.close(linger=0)

        actor = _node(raw, "actor", Path(tmp))
        sent: list[list] = []
        actor.send = lambda _name, frames, *_args, **_kwargs: sent.append(frames) or True
        actor._open_sockets()
        actor.setup()
        _, handler, _ = next(v for v in actor._handlers.values() if v[0] == "policy")
        seq = wire.decode(sent[0]).fields["seq"]  # lane 0's first request
        replies = [[bytes(f) for f in wire.encode(
            wire.ACT, {"action": rng.integers(0, 2, ENVS)}, seq=s)] for s in range(1 << 14)]

        def act() -> None:
            nonlocal seq
            handler([], wire.decode(replies[seq]))
            seq += 1  # the lane's next request (the harness does not decode it)

        out["actor_us"] = _best_us(act, number=500)
        for sock in actor.sockets.values():
            sock.close(linger=0)
    return out


def _child(checkout: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "ZMQRL_TENSORBOARD": "0"}
    proc = subprocess.run([sys.executable, __file__, "--child"], cwd=checkout, env=env,
                          capture_output=True, text=True, check=True)
    broker, reply, actor = proc.stdout.split()[-3:]
    return {"broker_us": float(broker), "broker_reply_us": float(reply),
            "actor_us": float(actor)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--checkout", type=Path, help="another checkout to compare with")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = measure()
        print(f"{result['broker_us']:.2f} {result['broker_reply_us']:.2f} "
              f"{result['actor_us']:.2f}")
        return
    checkouts = {"this": REPO} | ({"other": args.checkout.resolve()} if args.checkout else {})
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in checkouts}
    for i in range(args.rounds):
        for label, path in checkouts.items():
            runs[label].append(_child(path))
            last = runs[label][-1]
            print(f"round {i + 1} {label:5s} ({path}): broker {last['broker_us']:.1f} "
                  f"us/request ({last['broker_reply_us']:.1f} before the reply), actor "
                  f"{last['actor_us']:.1f} us/lane step", flush=True)
    for label, results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        print(f"median {label:5s}: broker {med['broker_us']:.1f} us per {ENVS}-env request "
              f"({med['broker_reply_us']:.1f} before the reply), actor {med['actor_us']:.1f} "
              f"us per {ENVS}-env lane step (CPU, best of 9 x 1,000)")


if __name__ == "__main__":
    main()
