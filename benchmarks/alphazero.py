"""AlphaZero on the bus: what BENCHMARKS.md records for topologies/alphazero.yaml.

    python benchmarks/alphazero.py throughput [--game connect_four] [--seconds 30] [--set ...]
    python benchmarks/alphazero.py tictactoe [--budget 1800] [--every 120]
    python benchmarks/alphazero.py connect4 [--budget 3600] [--every 900] [--games 20]
        [--eval-simulations 100 400] [--set algo.mirror_games=true ...]

``throughput``: MCTS simulations per second, one run: (1) this process, the search
evaluating its leaves with the network one at a time (what a search that does not batch
does: OpenSpiel's Python AlphaZero); (2) this process, all of a round's leaves in one
forward pass (``policy: local``); (3) through the bus, ``--actors`` mcts_actor processes
whose leaves the inference broker batches into one forward pass (``zmqrl up`` of the
topology without its learner and replay). Same game, network, search settings and
games in flight for all three.

``tictactoe``: trains topologies/alphazero.yaml on tic-tac-toe for ``--budget`` seconds
of wall time; every ``--every`` seconds the learner's latest checkpoint plays 100 games
(50 in each seat) against a perfect minimax player (``zmqrl.parts.search.minimax``), with the
same search it trained with (no root noise, the most visited move) and with its network
alone (the most likely legal move). Prints one row per evaluation: the losses of the
search and of the network, and the time at which the search first lost none. An
evaluation takes CPU from the training beside it (a few seconds each).

``connect4``: trains topologies/alphazero.yaml (connect four; ``--set`` overrides it as
``zmqrl up --set`` does) for ``--budget`` seconds, keeping a copy of the learner's
checkpoint every ``--every`` seconds; after the training (so that playing takes no CPU
from it) each copy plays ``--games`` games (half in each seat) against OpenSpiel's MCTS
bot with ``--bot-simulations`` random-rollout simulations a move.

Every line says the machine's load average: on a shared machine that is what makes
figures comparable.
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from zmqrl.parts import algo_config
from zmqrl.parts.devices import resolve_precision
from zmqrl.parts.envs import env_spec
from zmqrl.parts.games import Game, env_id
from zmqrl.parts.models import build_model
from zmqrl.parts.search.mcts import SearchParams, SelfPlay, model_evaluator, search
from zmqrl.parts.search.minimax import Minimax

REPO = Path(__file__).resolve().parents[1]
TOPOLOGY = REPO / "topologies" / "alphazero.yaml"


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


@contextmanager
def up(topology: dict, run_dir: Path, seconds: float) -> Iterator[subprocess.Popen]:
    """``zmqrl up`` of ``topology`` for at most ``seconds``; stopped (SIGTERM, which the
    supervisor passes on to its nodes) when the block exits, however it exits."""
    path = run_dir.parent / f"{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(topology))
    proc = subprocess.Popen([sys.executable, "-m", "zmqrl.cli", "up", str(path), "--run-dir",
                             str(run_dir), "--max-seconds", str(seconds)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait()


# ----- throughput ----------------------------------------------------------------------
def in_process(game: Game, model: torch.nn.Module, params: SearchParams, games: int,
               one_by_one: bool, seconds: float, precision: str = "float32"
               ) -> tuple[float, float]:
    """(simulations per second of wall time, per CPU second) of this process, its
    forward passes in ``precision`` (the topology's broker's)."""
    play = SelfPlay(game, games, params, seed=0)
    evaluate = model_evaluator(model, one_by_one=one_by_one, precision=precision)
    play.feed(*evaluate(play.leaves()))  # warm-up: first forward passes are slow
    start, cpu, sims = time.perf_counter(), time.process_time(), play.simulations
    while time.perf_counter() - start < seconds:
        play.feed(*evaluate(play.leaves()))
    done = play.simulations - sims
    return done / (time.perf_counter() - start), done / (time.process_time() - cpu)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sample(run_dir: Path, actors: int) -> tuple[float, int, float] | None:
    """(wall time, simulations of all actors, CPU seconds of the actors and the broker)
    from the run's status files; None until every actor has searched."""
    import json

    try:
        status = {p.stem: json.loads(p.read_text()) for p in (run_dir / "status").glob("*.json")}
        sims = [int(status[f"actor.{i}"]["row"]["simulations"]) for i in range(actors)]
        pids = [status[f"actor.{i}"]["pid"] for i in range(actors)] + [status["broker"]["pid"]]
        cpu = sum(_cpu_s(pid) for pid in pids)
    except (KeyError, ValueError, OSError):
        return None  # not written yet (or mid-write)
    return (time.perf_counter(), sum(sims), cpu) if min(sims) > 0 else None


def through_broker(raw: dict, actors: int, games: int, lanes: int, seconds: float
                   ) -> tuple[float, float, float]:
    """(simulations per second of wall time, per CPU second of the actors and the broker,
    leaves per forward pass) of ``actors`` mcts_actor processes and one broker."""
    topo = {**raw, "nodes": {
        "broker": {"kind": "inference_broker",
                   "args": raw["nodes"]["broker"].get("args", {})},
        "actor": {"kind": "mcts_actor", "replicas": actors,
                  "args": {"games": games, "lanes": lanes},
                  "links": {"policy": "broker.policy"}}}}
    with tempfile.TemporaryDirectory(prefix="zmqrl-az-") as tmp:
        run_dir = Path(tmp) / "run"
        with up(topo, run_dir, seconds + 600) as proc:
            first = None
            while first is None and proc.poll() is None:  # start-up is not search
                time.sleep(0.5)
                first = _sample(run_dir, actors)
            time.sleep(5.0)  # the first moves' forward passes are slow: past them
            first = _sample(run_dir, actors)
            time.sleep(seconds)
            last = _sample(run_dir, actors)
        batch = [float(r["batch_envs_mean"]) for r in
                 csv.DictReader(open(run_dir / "metrics" / "broker.csv"))
                 if float(r["batch_envs_mean"] or 0) > 0]
    sims = last[1] - first[1]
    return (sims / (last[0] - first[0]), sims / (last[2] - first[2]),
            float(np.mean(batch[len(batch) // 3:])))


def throughput(args: argparse.Namespace) -> None:
    from zmqrl.cli import _overrides
    from zmqrl.run.topology import merge

    torch.set_num_threads(1)
    raw = merge(yaml.safe_load(TOPOLOGY.read_text()), _overrides(tuple(args.set)))
    raw["env"] = {"id": env_id(args.game)}
    if args.simulations:
        raw["algo"]["num_simulations"] = args.simulations
    actor = raw["nodes"]["actor"]
    args.actors = args.actors or actor.get("replicas", 1)
    args.lanes = args.lanes or actor["args"]["lanes"]
    args.games = args.games or actor["args"]["games"]
    game = Game(args.game)
    model = build_model(raw["model"], env_spec(raw["env"]), seed=0).eval()
    params = SearchParams.of(algo_config.parse(raw["algo"]))
    games = args.actors * args.games * args.lanes  # the same games in flight everywhere
    precision = resolve_precision(raw["nodes"]["broker"].get("args", {}).get(
        "precision", "float32"), torch.device("cpu"))
    print(f"{args.game}, model {raw['model']}, {params.num_simulations} simulations a move, "
          f"{games} games in flight, forward passes in {precision}")
    rows = []
    for name, run in (
            ("in-process, one leaf per forward pass",
             # float32: for one position a call, autocast's casts cost more than they save
             lambda: in_process(game, model, params, games, True, args.seconds)),
            ("in-process, a round's leaves per forward pass",
             lambda: in_process(game, model, params, games, False, args.seconds,
                                precision)),
            (f"bus: {args.actors} actors x {args.lanes} lanes x {args.games} games, broker",
             lambda: through_broker(raw, args.actors, args.games, args.lanes, args.seconds))):
        out = run()
        rows.append(out)
        batch = f", {out[2]:.1f} leaves per forward pass" if len(out) > 2 else ""
        print(f"{name}: {out[0]:,.0f} simulations/s, {out[1]:,.0f} per CPU second{batch} "
              f"({load()})", flush=True)
    one, batched, bus = rows
    print(f"bus / one by one: {bus[0] / one[0]:.2f}x per second, {bus[1] / one[1]:.2f}x per "
          f"CPU second; in-process batched / one by one: {batched[0] / one[0]:.2f}x")


# ----- tic-tac-toe against a perfect player -----------------------------------------------
def versus_minimax(game: Game, model: torch.nn.Module, params: SearchParams, games: int,
                   use_search: bool, seed: int = 0) -> tuple[int, int, int]:
    return versus(game, model, params, games, use_search, Minimax().act, seed)


def versus(game: Game, model: torch.nn.Module, params: SearchParams, games: int,
           use_search: bool, opponent: Callable[[Any, np.random.Generator], int],
           seed: int = 0) -> tuple[int, int, int]:
    """(wins, draws, losses) of the agent against ``opponent`` (state, rng -> move) over
    ``games`` games, half in each seat, all played side by side (the agent's moves of
    all games searched together)."""
    rng = np.random.default_rng(seed)
    evaluate = model_evaluator(model)
    states = [game.new_state() for _ in range(games)]
    seats = [i % 2 for i in range(games)]
    while True:
        live = [i for i, s in enumerate(states) if not s.is_terminal()]
        if not live:
            break
        ours = [i for i in live if states[i].current_player() == seats[i]]
        for i in live:
            if i not in ours:
                states[i].apply_action(opponent(states[i], rng))
        if not ours:
            continue
        if use_search:
            visits = search(game, [states[i] for i in ours], evaluate, params, seed=seed)
        else:
            obs = game.observations([states[i] for i in ours],
                                    np.array([seats[i] for i in ours]))
            logits, _ = evaluate(obs)
            visits = np.exp(logits - logits.max(-1, keepdims=True))
        for row, i in zip(visits, ours, strict=True):
            row = np.where(game.legal_mask(states[i]), row, -1.0)
            best = np.flatnonzero(row == row.max())
            states[i].apply_action(int(best[rng.integers(len(best))]))
    results = [s.returns()[seat] for s, seat in zip(states, seats, strict=True)]
    return (sum(r > 0 for r in results), sum(r == 0 for r in results),
            sum(r < 0 for r in results))


def connect4(args: argparse.Namespace) -> None:
    """Train topologies/alphazero.yaml as it is for ``--budget`` seconds, copying the
    checkpoint every ``--every`` seconds; then each copy plays ``--games`` games against
    OpenSpiel's MCTS bot with random rollouts."""
    from open_spiel.python.algorithms import mcts as spiel_mcts

    from zmqrl.cli import _overrides
    from zmqrl.run.topology import merge

    torch.set_num_threads(1)
    raw = merge(yaml.safe_load(TOPOLOGY.read_text()), _overrides(tuple(args.set)))
    raw["nodes"]["learner"]["args"].update(checkpoint_every=50)
    print(f"algo: {raw['algo']}; replay: {raw['nodes']['replay']['args']}", flush=True)
    game = Game("connect_four")
    params = SearchParams.of(algo_config.parse(raw["algo"]), dirichlet_fraction=0.0)
    model = build_model(raw["model"], env_spec(raw["env"]), seed=0).eval()

    with tempfile.TemporaryDirectory(prefix="zmqrl-az-c4-") as tmp:
        run_dir = Path(tmp) / "run"
        start = time.monotonic()
        checkpoint = run_dir / "checkpoints" / "learner.pt"
        copies: list[tuple[float, dict]] = []

        def keep() -> None:
            if checkpoint.exists():
                copies.append((time.monotonic() - start, torch.load(
                    checkpoint, map_location="cpu", weights_only=True)))

        with up(raw, run_dir, args.budget) as proc:
            for mark in np.arange(args.every, args.budget, args.every):
                try:
                    proc.wait(max(0.0, start + mark - time.monotonic()))
                    break  # the run ended before this mark
                except subprocess.TimeoutExpired:
                    keep()
            proc.wait()
        keep()
    print(f"connect four: trained with {params.num_simulations} simulations a move; against "
          f"OpenSpiel's MCTS bot with {args.bot_simulations} random-rollout simulations, "
          f"{args.games} games per checkpoint (half in each seat)")
    for at, state in copies:
        model.load_state_dict(state["model"])
        for simulations in args.eval_simulations or [params.num_simulations]:
            bot = spiel_mcts.MCTSBot(
                game.game, 2.0, args.bot_simulations,
                spiel_mcts.RandomRolloutEvaluator(1, np.random.RandomState(0)),
                random_state=np.random.RandomState(1), solve=True)

            def opponent(state: Any, _rng: np.random.Generator, bot: Any = bot) -> int:
                return int(bot.step(state))

            t0 = time.monotonic()
            won, drawn, lost = versus(game, model, replace(params, num_simulations=simulations),
                                      args.games, True, opponent)
            print(f"trained {at:5.0f} s, {state['updates']:6d} updates, searching "
                  f"{simulations} simulations: W/D/L {won}/{drawn}/{lost} (win rate "
                  f"{won / args.games:.2f}; {time.monotonic() - t0:.0f} s to play; {load()})",
                  flush=True)


def tictactoe(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    raw = yaml.safe_load(TOPOLOGY.read_text())
    raw["env"] = {"id": env_id("tic_tac_toe")}
    raw["name"] = "alphazero-tic-tac-toe"
    raw["model"] = {"kind": "pv_mlp", "hidden": args.hidden}
    raw["algo"].update(num_simulations=args.simulations, batch_size=128,
                       temperature_moves=args.temperature_moves)
    raw["nodes"]["replay"]["args"].update(capacity=20_000, min_size=500)
    raw["nodes"]["learner"]["args"].update(checkpoint_every=50)
    raw["nodes"]["actor"]["args"].update(games=args.games)
    game = Game("tic_tac_toe")
    spec = env_spec(raw["env"])
    params = SearchParams.of(algo_config.parse(raw["algo"]), dirichlet_fraction=0.0)
    model = build_model(raw["model"], spec, seed=0).eval()
    print(f"tic-tac-toe vs minimax, 100 games (50 per seat), search {params.num_simulations} "
          "simulations a move; W/D/L of the agent")
    print("| wall s | learner updates | search W/D/L | network alone W/D/L | load |")
    print("|---|---|---|---|---|")
    untrained = [versus_minimax(game, model, params, 100, s) for s in (True, False)]
    print(f"| 0 (untrained) | 0 | {'/'.join(map(str, untrained[0]))} | "
          f"{'/'.join(map(str, untrained[1]))} | {os.getloadavg()[0]:.1f} |", flush=True)
    with tempfile.TemporaryDirectory(prefix="zmqrl-az-ttt-") as tmp:
        run_dir = Path(tmp) / "run"
        start = time.monotonic()
        checkpoint = run_dir / "checkpoints" / "learner.pt"
        first_perfect = None
        next_eval = args.every
        with up(raw, run_dir, args.budget) as proc:
            while proc.poll() is None:
                time.sleep(1.0)
                elapsed = time.monotonic() - start
                if elapsed < next_eval or not checkpoint.exists():
                    continue
                next_eval += args.every
                try:
                    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
                except (RuntimeError, EOFError):
                    continue  # (never half-written: the checkpointer renames; be safe anyway)
                model.load_state_dict(state["model"])
                with_search = versus_minimax(game, model, params, 100, True)
                alone = versus_minimax(game, model, params, 100, False)
                if with_search[2] == 0 and first_perfect is None:
                    first_perfect = elapsed
                print(f"| {elapsed:.0f} | {state['updates']} | {'/'.join(map(str, with_search))} | "
                      f"{'/'.join(map(str, alone))} | {os.getloadavg()[0]:.1f} |", flush=True)
        print(f"search first lost none of 100 at {first_perfect:.0f} s of wall time"
              if first_perfect is not None else "search lost some game at every evaluation")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--game", default="connect_four")
    t.add_argument("--seconds", type=float, default=30.0)
    # 0: the topology's actors (replicas, lanes, games per lane)
    t.add_argument("--actors", type=int, default=0)
    t.add_argument("--lanes", type=int, default=0)
    t.add_argument("--games", type=int, default=0)
    t.add_argument("--simulations", type=int, default=0, help="0: the topology's")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override the topology, as zmqrl up --set")
    t.set_defaults(run=throughput)
    c = sub.add_parser("tictactoe")
    c.add_argument("--budget", type=float, default=1800.0)
    c.add_argument("--every", type=float, default=120.0)
    c.add_argument("--simulations", type=int, default=50)
    c.add_argument("--hidden", type=int, nargs="+", default=[128, 128])
    c.add_argument("--games", type=int, default=64, help="games per actor lane")
    # tic-tac-toe is 9 moves: every self-play move sampled in proportion to the visits
    c.add_argument("--temperature-moves", type=int, default=9)
    c.set_defaults(run=tictactoe)
    f = sub.add_parser("connect4")
    f.add_argument("--budget", type=float, default=3600.0)
    f.add_argument("--games", type=int, default=20)
    f.add_argument("--every", type=float, default=900.0, help="seconds between checkpoints kept")
    f.add_argument("--eval-simulations", type=int, nargs="+", default=None,
                   help="the search's simulations a move when playing (default: as trained)")
    f.add_argument("--bot-simulations", type=int, default=1000)
    f.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override the topology, as zmqrl up --set")
    f.set_defaults(run=connect4)
    args = parser.parse_args()
    # SIGTERM exits as Ctrl-C does, through ``up``'s cleanup: a benchmark killed never
    # leaves its zmqrl up running for the rest of its budget
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.run(args)


if __name__ == "__main__":
    main()
