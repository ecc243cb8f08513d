"""PBT against the same population without it: the best member's return and wall time.

    python benchmarks/pbt.py [--seeds 1 2 3] [--max-steps 200000] [--set key=value ...]
        [--out DIR [--at STEPS ...] [--reach R]] [--read-only] [--arms pbt fixed]
        [topologies/pbt_seed.yaml]

Per seed, two runs of `zmqrl up T --max-steps N --set seed=S` (N: env steps of all
members together, so both arms see the same): one with PBT as the topology says, one
with `population.ready_after_steps` beyond N (the same members, the same draws, no
ready point: no exploit). Each run reports the best member's mean return over its last
100 and 20 episodes (from the learners' last metrics rows), the median over the members
of that return (PBT's exploits lift the weak members first), the exploits made, the wall
time (process start-up included) and the machine's mean load average over the run
(sampled every 5 s; on a shared machine it says how comparable runs are). With ``--out``
the members' metrics and the lineage are kept and plotted (DIR/pbt.png): each member's
return against its env steps in both arms, and the PBT members' hyperparameters.

A final figure says little where every arm ends at a ceiling (CartPole's 500), so with
``--out`` the kept curves are also read part-way: ``--at`` a member's env steps, each
arm's median and best member's return(100) there, and with ``--reach`` the env steps each
member took to first reach that return. ``--read-only`` reads a kept ``--out`` again
(the plot and the table) without running.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def last_row(path: Path) -> dict[str, str]:
    with path.open() as f:
        rows = list(csv.DictReader(f))
    return rows[-1] if rows else {}


def run(topology: str, seed: int, max_steps: int, pbt: bool, overrides: list[str],
        keep: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="zmqrl-pbt-") as run_dir:
        cmd = [sys.executable, "-m", "zmqrl.cli", "up", topology, "--max-steps", str(max_steps),
               "--set", f"seed={seed}", "--run-dir", run_dir]
        for override in overrides:
            cmd += ["--set", override]
        if not pbt:
            cmd += ["--set", f"population.ready_after_steps={10 * max_steps}"]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        loads = []
        while proc.poll() is None:
            loads.append(os.getloadavg()[0])
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        wall = time.monotonic() - start
        members = {}
        for path in sorted(Path(run_dir, "metrics").glob("learner_m*.csv")):
            row = last_row(path)
            if row:
                members[path.stem] = {k: float(row[k]) for k in
                                      ("return_mean_100", "return_mean_20", "env_steps",
                                       "hp_lr")}
        lineage = Path(run_dir, "pbt", "lineage.jsonl")
        exploits = len(lineage.read_text().splitlines()) if lineage.exists() else 0
        if keep is not None:  # the members' metrics and the lineage, for the plot
            keep.mkdir(parents=True, exist_ok=True)
            for path in Path(run_dir, "metrics").glob("learner_m*.csv"):
                shutil.copy(path, keep / path.name)
            if lineage.exists():
                shutil.copy(lineage, keep / lineage.name)
    best = max(members.values(), key=lambda m: m["return_mean_100"]) if members else {}
    return {"seed": seed, "pbt": pbt, "rc": proc.returncode, "wall_s": round(wall, 1),
            "members_return_100": sorted(m["return_mean_100"] for m in members.values()),
            "load": round(sum(loads) / max(len(loads), 1), 1), "exploits": exploits,
            "best_return_100": best.get("return_mean_100"),
            "best_return_20": best.get("return_mean_20"), "best_lr": best.get("hp_lr"),
            "median_return_100": round(statistics.median(
                m["return_mean_100"] for m in members.values()), 1) if members else None,
            "env_steps": sum(m["env_steps"] for m in members.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("topology", nargs="?", default="topologies/pbt_seed.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--max-steps", type=int, default=200_000)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", type=Path, help="keep each run's members' metrics and "
                        "lineage here (<out>/seed<S>-pbt|fixed/) and draw <out>/pbt.png")
    parser.add_argument("--at", type=int, nargs="+", default=[],
                        help="read the kept curves at these env steps of a member")
    parser.add_argument("--reach", type=float, help="and the env steps to this return(100)")
    parser.add_argument("--read-only", action="store_true", help="plot and read --out, run nothing")
    parser.add_argument("--arms", nargs="+", choices=("pbt", "fixed"), default=["pbt", "fixed"],
                        help="run only these (a knob of PBT's beside a kept fixed arm)")
    args = parser.parse_args()
    if (args.at or args.reach is not None or args.read_only) and not args.out:
        parser.error("--at, --reach and --read-only read the curves kept by --out")
    if args.read_only:
        plot(args.out, args.seeds)
        read_curves(args.out, args.seeds, args.at, args.reach)
        return
    print("| seed | PBT | best return(100) | best return(20) | its lr | members' median "
          "return(100) | exploits | env steps | wall s | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for seed in args.seeds:
        for pbt in (arm == "pbt" for arm in args.arms):
            keep = args.out / f"seed{seed}-{'pbt' if pbt else 'fixed'}" if args.out else None
            r = run(args.topology, seed, args.max_steps, pbt, args.overrides, keep)
            print(f"| {seed} | {'yes' if pbt else 'no'} | {r['best_return_100']} | "
                  f"{r['best_return_20']} | {r['best_lr'] or 0:.2e} | {r['median_return_100']} | "
                  f"{r['exploits']} | "
                  f"{r['env_steps']:,.0f} | {r['wall_s']} | {r['load']} |", flush=True)
            print(json.dumps(r), file=sys.stderr, flush=True)
    if args.out:
        plot(args.out, args.seeds)
        if args.at or args.reach is not None:
            read_curves(args.out, args.seeds, args.at, args.reach)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return [r for r in csv.DictReader(f) if r.get("return_mean_100") not in (None, "")]


def _curve(path: Path) -> list[tuple[float, float]]:
    return [(float(r["env_steps"]), float(r["return_mean_100"])) for r in _rows(path)
            if r["return_mean_100"] != "nan"]


def _at(curve: list[tuple[float, float]], steps: float) -> float:
    """The last return(100) reported at or before ``steps`` of the member (nan: none)."""
    before = [ret for s, ret in curve if s <= steps]
    return before[-1] if before else float("nan")


def read_curves(out: Path, seeds: list[int], at: list[int], reach: float | None) -> None:
    """A markdown table: per seed and arm, the members' median and best return(100) at
    each of ``at`` member env steps, and each member's env steps to ``reach`` (sorted)."""
    head = "| seed | arm | " + " | ".join(f"median / best at {k:,}" for k in at)
    head += f" | members to {reach:g} (k steps) |" if reach is not None else " |"
    print(head)
    print("|---|---|" + "---|" * (len(at) + (reach is not None)))
    for seed in seeds:
        for arm in ("pbt", "fixed"):
            curves = [_curve(p) for p in sorted((out / f"seed{seed}-{arm}").glob(
                "learner_m*.csv"))]
            if not curves:
                continue
            cells = []
            for k in at:
                values = [_at(c, k) for c in curves]
                cells.append(f"{statistics.median(values):.1f} / {max(values):.1f}")
            if reach is not None:
                firsts = sorted(next((s for s, ret in c if ret >= reach), float("inf"))
                                for c in curves)
                cells.append(", ".join("never" if s == float("inf") else f"{s / 1000:.0f}"
                                       for s in firsts))
            print(f"| {seed} | {arm} | " + " | ".join(cells) + " |")


def plot(out: Path, seeds: list[int]) -> None:
    """Per seed: each member's return(100) against its env steps, PBT's (solid) and the
    fixed population's (dashed); and each PBT member's hyperparameters (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    thousands = FuncFormatter(lambda x, _: f"{x / 1000:g}k")  # 150k, not 150000 run together
    runs = {seed: {arm: sorted((out / f"seed{seed}-{arm}").glob("learner_m*.csv"))
                   for arm in ("pbt", "fixed")} for seed in seeds}
    hypers = sorted({k for seed in seeds for path in runs[seed]["pbt"]
                     for k in (_rows(path)[:1] or [{}])[0] if k.startswith("hp_")})
    fig, axes = plt.subplots(1 + len(hypers), len(seeds), squeeze=False,
                             figsize=(4.5 * len(seeds), 3.2 * (1 + len(hypers))))
    for col, seed in enumerate(seeds):
        ax = axes[0][col]
        for arm, style in (("pbt", "-"), ("fixed", "--")):
            for i, path in enumerate(runs[seed][arm]):
                rows = _rows(path)
                ax.plot([float(r["env_steps"]) for r in rows],
                        [float(r["return_mean_100"]) for r in rows], style, color=f"C{i}",
                        lw=1.2, label=f"{path.stem.split('_')[-1]} {arm}")
        ax.set_title(f"seed {seed}: return(100), PBT solid, fixed dashed", fontsize=9)
        ax.set_xlabel("member's env steps")
        ax.xaxis.set_major_formatter(thousands)
        if col == 0:
            ax.legend(fontsize=6, ncol=2)
        for row, key in enumerate(hypers, start=1):
            ax = axes[row][col]
            for i, path in enumerate(runs[seed]["pbt"]):
                rows = [r for r in _rows(path) if r.get(key) not in (None, "")]
                ax.plot([float(r["env_steps"]) for r in rows], [float(r[key]) for r in rows],
                        color=f"C{i}", lw=1.2)
            ax.set_yscale("log")
            ax.set_title(f"PBT members' {key.removeprefix('hp_')}", fontsize=9)
            ax.set_xlabel("member's env steps")
            ax.xaxis.set_major_formatter(thousands)
    fig.tight_layout()
    fig.savefig(out / "pbt.png", dpi=80)
    print(f"plot: {out / 'pbt.png'}")


if __name__ == "__main__":
    main()
