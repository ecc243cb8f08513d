"""Does Capture the Flag's recipe pay? What BENCHMARKS.md records for
topologies/population_league.yaml.

    python benchmarks/population_league.py run --seconds 900 --out DIR [--seed S] [--set K=V]
    python benchmarks/population_league.py compare DIR [--games 400] [--bot-simulations 100 25]
        [--bot-against both|population|all]
    python benchmarks/population_league.py plot DIR [DIR ...] [--png PNG]
    python benchmarks/population_league.py summary DIR [DIR ...]

``run``: two arms of equal wall time on this machine, one after the other.
(1) ``zmqrl up topologies/population_league.yaml`` (four members that play each other,
matched by rating, PBT on rating) for ``--seconds``. (2) The same four hyperparameter
draws (the population section's, drawn with the topology's seed) as four independent
``topologies/selfplay.yaml`` runs side by side for ``--seconds``: the same game, model,
algorithm settings, initial weights, snapshot cadence and share of games against the
latest policy, each learner playing only itself and its own snapshots, the same 64 envs
in all (16 per run), and no league (the population's arm runs no evaluation either).

``compare``: after the training (so that playing takes no CPU from it): the population's
best member and the best independent run, each picked by a round robin among its own
arm's four (``--round-robin-games`` a pair; ``--pick rating`` picks the population's by
the league's last ratings instead, as before 2026-12-06), play ``--games`` games head to head,
half in each seat, each policy sampling its moves as it does in training; then each
plays ``--games`` games against OpenSpiel's MCTS bot with ``--bot-simulations``
random-rollout simulations a move (several values: a yardstick of each strength;
``--bot-against all``: every member of both arms, and each arm's total). Torch's
generator, which samples the policies' moves, is seeded (``--seed``) afresh before each
stage: compare run again plays the same games. Prints the records and writes
``compare.json``.

``plot``: per run directory, the population members' Elo over time (the league's
``league/ratings.jsonl``, PBT's exploits dotted) and their hyperparameters over time (the
learners' ``hp_`` columns), as a PNG. ``summary``: the ``compare.json`` of each directory
as a Markdown table.

Every result line says the machine's load average: on a shared machine that is what
makes figures comparable.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
TOPOLOGY = REPO / "topologies" / "population_league.yaml"


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


def topology(seed: int | None) -> dict[str, Any]:
    """The population topology as a run with ``--seed`` loads it."""
    raw = yaml.safe_load(TOPOLOGY.read_text())
    if seed is not None:
        raw["seed"] = seed
    return raw


def member_draws(seed: int | None = None) -> list[dict[str, Any]]:
    """Each member's hyperparameters, as ``population.expand`` draws them for the run."""
    from zmqrl.run import population

    expanded = population.expand(topology(seed))
    return [expanded["nodes"][f"learner_m{k}"]["args"]["hyperparameters"]
            for k in range(len([n for n in expanded["nodes"] if n.startswith("learner_m")]))]


def up(topology: Path, run_dir: Path, seconds: float, sets: list[str], log: Path
       ) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "zmqrl.cli", "up", str(topology), "--run-dir", str(run_dir),
           "--max-seconds", str(seconds)]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    draws = member_draws(args.seed)
    (out / "draws.json").write_text(json.dumps(draws, indent=1))
    started = time.time()
    seed_set = [] if args.seed is None else [f"seed={args.seed}"]
    proc = up(TOPOLOGY, out / "population", args.seconds, seed_set + args.set,
              out / "population.log")
    if proc.wait() != 0:
        raise SystemExit(f"the population's run failed: {out / 'population.log'}")
    print(f"population: {time.time() - started:.0f} s; {load()}", flush=True)
    if args.population_only:
        return
    raw = topology(args.seed)
    broker_args = raw["nodes"]["broker"]["args"]
    started = time.time()
    procs = []
    for k, draw in enumerate(draws):
        # selfplay.yaml as the population's members are: the same game, model, algorithm
        # (with member k's draw), initial weights (the topology's seed: every member
        # starts from the same ones), snapshot cadence and share of games against the
        # latest policy; no league (the population's arm evaluates nothing while it runs)
        single = yaml.safe_load((REPO / "topologies" / "selfplay.yaml").read_text())
        single.update(env=raw["env"], model=raw["model"], algo={**raw["algo"], **draw},
                      seed=raw["seed"])
        single["self_play"] = {"snapshot_every": broker_args["snapshot_every"],
                               "pool_size": broker_args["pool_size"],
                               "latest_fraction": broker_args["matchmaker"]["latest_fraction"]}
        single["nodes"].pop("league")
        single["nodes"]["actor"].update(replicas=1, args={"envs": 16})
        single["nodes"]["learner"]["args"] = {"checkpoint_every": 20}
        path = out / f"independent_{k}.yaml"
        path.write_text(yaml.safe_dump(single))
        procs.append(up(path, out / f"independent_{k}", args.seconds, [],
                        out / f"independent_{k}.log"))
    failed = [k for k, p in enumerate(procs) if p.wait() != 0]
    if failed:
        raise SystemExit(f"independent runs {failed} failed (logs in {out})")
    print(f"independent x{len(draws)}: {time.time() - started:.0f} s; {load()}", flush=True)


def _model(run_dir: Path, label: str) -> Any:
    import torch

    from zmqrl.parts.envs import env_spec
    from zmqrl.parts.models import build_model
    from zmqrl.parts.selfplay.acting import frozen_copy

    raw = yaml.safe_load((run_dir / "topology.yaml").read_text()) \
        if (run_dir / "topology.yaml").exists() else yaml.safe_load(TOPOLOGY.read_text())
    model = build_model(raw["model"], env_spec(raw["env"]), seed=0)
    state = torch.load(run_dir / "checkpoints" / f"{label}.pt", map_location="cpu",
                       weights_only=True)
    model.load_state_dict(state["model"])
    return frozen_copy(model), int(state.get("updates", -1))


def _play(game: Any, a: Any, b: Any, games: int) -> tuple[float, float, float]:
    from zmqrl.parts.selfplay.matches import Evaluation, Match

    evaluation = Evaluation(game, [Match(a, b, games)])
    while not evaluation.advance(60.0):
        pass
    return evaluation.results()[(a.name, b.name)]


def _score(record: tuple[float, float, float]) -> float:
    wins, draws, losses = record
    return (wins + 0.5 * draws) / max(1.0, wins + draws + losses)


def _interval(record: tuple[float, float, float]) -> tuple[float, float]:
    """The score's 95 % interval (normal approximation over the games' scores 1, 1/2, 0)."""
    wins, draws, losses = record
    n = max(1.0, wins + draws + losses)
    mean = _score(record)
    var = (wins + 0.25 * draws) / n - mean * mean
    half = 1.96 * (max(var, 0.0) / n) ** 0.5
    return max(0.0, mean - half), min(1.0, mean + half)


def _record_text(record: tuple[float, float, float]) -> str:
    low, high = _interval(record)
    return (f"{record[0]:.0f} W {record[1]:.0f} D {record[2]:.0f} L (score "
            f"{_score(record):.3f}, 95 % [{low:.3f}, {high:.3f}])")


def _round_robin(game: Any, players: list[tuple[Any, int]], games: int) -> dict[str, float]:
    """Each player's summed score over ``games`` games against every other."""
    scores = {p.name: 0.0 for p, _ in players}
    for i, (a, _) in enumerate(players):
        for b, _ in players[i + 1:]:
            record = _play(game, a, b, games)
            scores[a.name] += _score(record)
            scores[b.name] += 1.0 - _score(record)
    return scores


def compare(args: argparse.Namespace) -> None:
    import torch

    from zmqrl.parts.games import Game, game_name
    from zmqrl.parts.selfplay.matches import MCTSPlayer, PolicyPlayer

    torch.set_num_threads(1)
    out = Path(args.dir)
    raw = yaml.safe_load(TOPOLOGY.read_text())
    game = Game(game_name(raw["env"]))
    history = (out / "population" / "league" / "ratings.jsonl").read_text().splitlines()
    if not history:
        raise SystemExit(f"{out}/population/league/ratings.jsonl is empty: the run rated "
                         "no game (see population.log)")
    ratings = json.loads(history[-1])["ratings"]
    members = sorted(k for k in ratings if k.startswith("m") and "@" not in k)
    population_players = []
    for m in members:
        model, updates = _model(out / "population", f"learner_{m}")
        population_players.append((PolicyPlayer(f"population_{m}", model), updates))
    independents = []
    for run_dir in sorted(out.glob("independent_*")):
        if run_dir.is_dir():
            model, updates = _model(run_dir, "learner")
            independents.append((PolicyPlayer(run_dir.name, model), updates))
    # Each arm's best is picked the same way: a round robin among its own four. (The
    # league's last rating is a noisy pick: members' ratings lie within ~50 points and
    # one history line moved one by 80.)
    # The policies sample their moves with torch's generator: seeded afresh before each
    # stage, so that a compare run again plays the same games, and the independent arm's
    # round robin is the same games whichever population directory it sits beside.
    if args.pick == "rating":
        pop_scores = {f"population_{m}": ratings[m] for m in members}
    else:
        torch.manual_seed(args.seed)
        pop_scores = _round_robin(game, population_players, args.round_robin_games)
    population, pop_updates = max(population_players, key=lambda pu: pop_scores[pu[0].name])
    best_member = population.name.removeprefix("population_")
    torch.manual_seed(args.seed)
    scores = _round_robin(game, independents, args.round_robin_games)
    best, best_updates = max(independents, key=lambda pu: scores[pu[0].name])
    report: dict[str, Any] = {
        "population_best": best_member, "population_updates": pop_updates,
        "population_pick": args.pick, "seed": args.seed, "population_scores": pop_scores,
        "population_ratings": {k: v for k, v in ratings.items() if "@" not in k},
        "independent_round_robin": scores, "independent_best": best.name,
        "independent_updates": best_updates,
        "updates_all": {"population": {p.name: u for p, u in population_players},
                        "independent": {p.name: u for p, u in independents}}}
    torch.manual_seed(args.seed)
    record = _play(game, population, best, args.games)
    report["head_to_head"] = dict(zip(("wins", "draws", "losses"), record, strict=True))
    report["head_to_head"]["interval"] = _interval(record)
    print(f"head to head, {args.games} games: population {best_member} "
          f"{_record_text(record)} against {best.name}; {load()}", flush=True)
    # The yardsticks: MCTS bots of each strength asked (the first's records also under
    # the keys vs_mcts_<player>, as before several could be asked)
    report["yardsticks"] = {}
    against = {"both": [population, best], "population": [population],
               # every member of each arm: how the arms compare as wholes, not only
               # through their picks (a round robin picks who beats its own peers)
               "all": [p for p, _ in population_players + independents]}[args.bot_against]
    for n, simulations in enumerate(args.bot_simulations):
        for player in against:
            torch.manual_seed(args.seed)
            bot = MCTSPlayer(game, simulations, seed=7)
            record = _play(game, player, bot, args.games)
            result = dict(zip(("wins", "draws", "losses"), record, strict=True))
            report["yardsticks"].setdefault(str(simulations), {})[player.name] = result
            if n == 0:
                report[f"vs_mcts_{player.name}"] = result
            print(f"{player.name} against MCTS-{simulations}, {args.games} games: "
                  f"{_record_text(record)}; {load()}", flush=True)
        if args.bot_against == "all":
            for arm in ("population", "independent"):
                records = [r for name, r in report["yardsticks"][str(simulations)].items()
                           if name.startswith(arm)]
                total = tuple(sum(r[k] for r in records) for k in ("wins", "draws", "losses"))
                print(f"{arm}'s {len(records)} against MCTS-{simulations}, "
                      f"{args.games} games each: {_record_text(total)}", flush=True)
    (out / "compare.json").write_text(json.dumps(report, indent=1))


def _csv_rows(path: Path) -> list[dict[str, str]]:
    import csv

    with path.open() as f:
        return list(csv.DictReader(f))


def plot(args: argparse.Namespace) -> None:
    """Per run directory (a column): the members' Elo over time with PBT's exploits
    dotted, and below it each member's hyperparameters over time (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outs = [Path(d) for d in args.dirs]
    # each run's members' metrics rows, read once: {run: {member: rows}}
    learners = {out: {path.stem.removeprefix("learner_"): _csv_rows(path) for path in
                      sorted((out / "population" / "metrics").glob("learner_m*.csv"))}
                for out in outs}
    hypers = sorted({k for tables in learners.values() for rows in tables.values()
                     for k in (rows[:1] or [{}])[0] if k.startswith("hp_")})
    fig, axes = plt.subplots(1 + len(hypers), len(outs), squeeze=False,
                             figsize=(5.5 * len(outs), 3.4 * (1 + len(hypers))))
    for col, out in enumerate(outs):
        rows = [json.loads(line) for line in
                (out / "population" / "league" / "ratings.jsonl").read_text().splitlines()]
        t0 = rows[0]["time"]
        ax = axes[0][col]
        for i, m in enumerate(sorted({k for r in rows for k in r["ratings"]})):
            pts = [((r["time"] - t0) / 60, r["ratings"][m]) for r in rows if m in r["ratings"]]
            ax.plot(*zip(*pts, strict=True), color=f"C{i}", label=m)
        lineage = out / "population" / "pbt" / "lineage.jsonl"
        if lineage.exists():
            for line in lineage.read_text().splitlines():
                ax.axvline((json.loads(line)["time"] - t0) / 60, color="grey", lw=0.5, ls=":")
        ax.set_xlabel("minutes")
        ax.set_ylabel("Elo (league, per game)")
        ax.set_title(f"{out.name}: members' ratings (dotted: PBT exploits)", fontsize=9)
        if col == 0:
            ax.legend(fontsize=7)
        for row, key in enumerate(hypers, start=1):
            ax = axes[row][col]
            for i, (member, rows) in enumerate(learners[out].items()):
                pts = [(float(r["time_s"]) / 60, float(r[key])) for r in rows
                       if r.get(key) not in (None, "")]
                if pts:
                    ax.plot(*zip(*pts, strict=True), color=f"C{i}", lw=1.2, label=member)
            ax.set_yscale("log")
            ax.set_xlabel("minutes (the learner's clock)")
            ax.set_title(f"{out.name}: members' {key.removeprefix('hp_')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.png, dpi=90)
    print(f"wrote {args.png}")


def summary(args: argparse.Namespace) -> None:
    """One table row per run directory's ``compare.json``: what BENCHMARKS.md records."""
    print("| run | population best (updates) | independent best (updates) | exploits | "
          "head to head (W D L) | score [95 %] | population, independent vs MCTS (by "
          "simulations) |")
    print("|---|---|---|---|---|---|---|")
    for d in args.dirs:
        report = json.loads((Path(d) / "compare.json").read_text())
        h2h = report["head_to_head"]
        record = (h2h["wins"], h2h["draws"], h2h["losses"])
        low, high = _interval(record)
        yardsticks = report.get("yardsticks") or {
            "first": {k.removeprefix("vs_mcts_"): v for k, v in report.items()
                      if k.startswith("vs_mcts_")}}
        texts = []
        for simulations, records in yardsticks.items():
            # each arm's pick (with --bot-against all, every member's record is there)
            for name in (f"population_{report['population_best']}",
                         report["independent_best"]):
                r = records.get(name)
                texts.append(f"{simulations}: not played" if r is None else
                             f"{simulations}: {_score((r['wins'], r['draws'], r['losses'])):.3f}"
                             f" ({r['wins']:.0f}/{r['draws']:.0f}/{r['losses']:.0f})")
        lineage = Path(d) / "population" / "pbt" / "lineage.jsonl"
        exploits = len(lineage.read_text().splitlines()) if lineage.exists() else 0
        print(f"| {Path(d).name} | {report['population_best']} "
              f"({report['population_updates']}) | {report['independent_best']} "
              f"({report['independent_updates']}) | {exploits}"
              f" | {record[0]:.0f} / {record[1]:.0f} / {record[2]:.0f} | "
              f"{_score(record):.3f} [{low:.3f}, {high:.3f}] | {'; '.join(texts)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run")
    p.add_argument("--seconds", type=float, default=900.0)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, help="the topology's seed (its draws and initial "
                   "weights; default: the file's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a change to the population's topology only, as `zmqrl up --set` "
                        "(a knob under test; the independent arm is unchanged)")
    p.add_argument("--population-only", action="store_true",
                   help="run the population's arm only (a knob under test: link the "
                        "independent_* directories of a run with the same --seed beside it)")
    p.set_defaults(fn=run)
    p = sub.add_parser("compare")
    p.add_argument("dir")
    p.add_argument("--games", type=int, default=400)
    p.add_argument("--round-robin-games", type=int, default=200,
                   help="games a pair in each arm's round robin (at 40, two of three "
                        "population picks changed between two passes)")
    p.add_argument("--pick", choices=("round-robin", "rating"), default="round-robin",
                   help="how the population's best member is picked (the independent "
                        "arm's always by round robin)")
    p.add_argument("--bot-simulations", type=int, nargs="+", default=[100],
                   help="the MCTS yardstick's random-rollout simulations a move; several "
                        "values: a yardstick of each strength")
    p.add_argument("--seed", type=int, default=0, help="torch's seed for the policies' "
                   "moves, set afresh before each stage")
    p.add_argument("--bot-against", choices=("both", "population", "all"), default="both",
                   help="population: only the population's best plays the MCTS bot (a "
                        "knob's run beside independent runs already measured); all: every "
                        "member of both arms does (the arms as wholes)")
    p.set_defaults(fn=compare)
    p = sub.add_parser("plot")
    p.add_argument("dirs", nargs="+", metavar="DIR")
    p.add_argument("--png", default=str(REPO / "docs" / "population_league_ratings.png"))
    p.set_defaults(fn=plot)
    p = sub.add_parser("summary")
    p.add_argument("dirs", nargs="+", metavar="DIR")
    p.set_defaults(fn=summary)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
