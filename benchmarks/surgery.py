"""Surgery on a running experiment (issue 45): what BENCHMARKS.md records.

    python benchmarks/surgery.py same-function [--seed 1] [--out DIR]
    python benchmarks/surgery.py new-observations [--seed 1] [--plateau-s 60] [--out DIR]
                                                  [--topology topologies/ppo_lstm.yaml]
    python benchmarks/surgery.py plot DIR [DIR ...] [--png docs/surgery.png] [--titles ...]

``same-function``: ``seed.yaml`` on CartPole until the mean return of the last 100
episodes reaches 400; the run is copied twice and resumed (a) under ``hidden: [128, 128,
128]`` (the surgery: wider and deeper) and (b) under its own topology (a plain resume,
the control: a restart of 64 envs sees its short episodes end first), each until 475
or ``--budget`` seconds. Printed: the mean return of the last 20 and 100 episodes
before the stop, of the first 20 and 100 after, and the updates and seconds to 475.

``new-observations``: ``--topology`` (default ``seed.yaml``: an MLP; a recurrent one,
``ppo_lstm.yaml`` or ``seed_r2d2.yaml``, can remember what the mask hides) on masked
CartPole (the velocities hidden, as ``seed_r2d2.yaml``'s POMDP) for ``--plateau-s``
seconds, then resumed on full CartPole with the velocities as new input features
(``--surgery-inputs 0,2``) until 475; against a fresh run of the same topology on full
CartPole from scratch, the same seed. Printed: the returns around the surgery, and the
updates to 475 after it against from scratch.

``plot``: return(20) against env steps of the runs in each DIR (a panel each), the
surgery marked.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEED = REPO / "topologies" / "seed.yaml"
MASKED = "env.id=zmqrl/CartPoleNoVelocity-v1"
FULL = "env.id=CartPole-v1"


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def up(run_dir: Path, *args: str, sets: tuple[str, ...] = ()) -> float:
    """``zmqrl up ...`` to its end; its wall seconds."""
    cmd = [sys.executable, "-m", "zmqrl.cli", "up", *args]
    if "--resume" not in args:
        cmd += ["--run-dir", str(run_dir)]
    for item in sets:
        cmd += ["--set", item]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    (run_dir / f"up-{int(time.time())}.log").write_text(done.stdout + done.stderr)
    return time.perf_counter() - start


def rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics" / "run.csv", newline="") as f:
        return list(csv.DictReader(f))


def around(run_dir: Path, start: int) -> dict[str, float]:
    """The run's figures around row ``start`` (its first row after a resume): the last
    20/100 episodes' mean before, the first 20/100 after (at the first row whose episode
    count passed them), and the updates and seconds from the resume to return(100) 475."""
    all_rows = rows(run_dir)
    before, after = all_rows[:start], all_rows[start:]
    episodes0 = int(before[-1]["episodes"])
    out = {"before_20": float(before[-1]["return_mean_20"]),
           "before_100": float(before[-1]["return_mean_100"])}
    for n in (20, 100):
        row = next((r for r in after if int(r["episodes"]) - episodes0 >= n), None)
        out[f"after_{n}"] = float(row[f"return_mean_{n}"]) if row else float("nan")
    updates0, time0 = int(before[-1]["updates"]), float(before[-1]["time_s"])
    reached = next((r for r in after if float(r["return_mean_100"]) >= 475), None)
    out["updates_to_475"] = int(reached["updates"]) - updates0 if reached else float("nan")
    out["seconds_to_475"] = float(reached["time_s"]) - time0 if reached else float("nan")
    out["env_steps_to_475"] = (int(reached["env_steps"]) - int(before[-1]["env_steps"])
                               if reached else float("nan"))
    out["last_100"] = float(after[-1]["return_mean_100"])
    # (from 20 episodes after the resume on: the first to end after a restart of all the
    # envs are the shortest of their batch, a sample of one to a few)
    out["lowest_20"] = min((float(r["return_mean_20"]) for r in after
                            if int(r["episodes"]) - episodes0 >= 20), default=float("nan"))
    return out


def show(name: str, f: dict[str, float]) -> None:
    print(f"{name}: return(20) {f['before_20']:.1f} before -> {f['after_20']:.1f} after "
          f"({f['after_20'] / f['before_20'] - 1:+.1%}); return(100) {f['before_100']:.1f} "
          f"-> {f['after_100']:.1f}; 475 after {f['updates_to_475']:.0f} updates, "
          f"{f['env_steps_to_475']:,.0f} env steps, "
          f"{f['seconds_to_475']:.0f} s; at the end return(100) {f['last_100']:.1f}, "
          f"lowest return(20) {f['lowest_20']:.1f} ({load()})", flush=True)


def same_function(args: argparse.Namespace) -> None:
    out = Path(args.out or tempfile.mkdtemp(prefix="zmqrl-surgery-"))
    first = out / "trained"
    shutil.rmtree(first, ignore_errors=True)
    up(first, str(SEED), "--target-return", "400", "--max-seconds", str(args.budget),
       sets=(f"seed={args.seed}",))
    trained = rows(first)
    print(f"trained: return(100) {float(trained[-1]['return_mean_100']):.1f} at "
          f"{int(trained[-1]['env_steps']):,} env steps, {trained[-1]['updates']} updates",
          flush=True)
    wide = out / "wide.yaml"
    wide.write_text(SEED.read_text().replace("hidden: [64, 64]", f"hidden: {args.hidden}"))
    assert wide.read_text() != SEED.read_text(), "seed.yaml's model is not hidden: [64, 64]"
    for name, topology in (("surgery", wide), ("plain resume", SEED)):
        run_dir = out / name.replace(" ", "-")
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.copytree(first, run_dir, ignore=shutil.ignore_patterns("ipc", "locks"))
        start = len(rows(run_dir))
        up(run_dir, str(topology), "--resume", str(run_dir), "--max-seconds",
           str(args.after_s), sets=(f"seed={args.seed}",))
        show(name, around(run_dir, start))


def new_observations(args: argparse.Namespace) -> None:
    out = Path(args.out or tempfile.mkdtemp(prefix="zmqrl-surgery-"))
    topology = str(Path(args.topology).resolve())
    masked = out / "masked"
    shutil.rmtree(masked, ignore_errors=True)
    up(masked, topology, "--max-seconds", str(args.plateau_s),
       sets=(f"seed={args.seed}", MASKED))
    trained = rows(masked)
    print(f"masked: return(100) {float(trained[-1]['return_mean_100']):.1f} at "
          f"{int(trained[-1]['env_steps']):,} env steps, {trained[-1]['updates']} updates",
          flush=True)
    start = len(trained)
    up(masked, topology, "--resume", str(masked), "--surgery-inputs", "0,2",
       "--target-return", "475", "--max-seconds", str(args.budget),
       sets=(f"seed={args.seed}", FULL))
    show("masked -> full (surgery)", around(masked, start))
    fresh = out / "fresh"
    shutil.rmtree(fresh, ignore_errors=True)
    up(fresh, topology, "--target-return", "475", "--max-seconds", str(args.budget),
       sets=(f"seed={args.seed}", FULL))
    reached = next((r for r in rows(fresh) if float(r["return_mean_100"]) >= 475), None)
    print("fresh on full CartPole: " + (
        f"475 after {reached['updates']} updates, {int(reached['env_steps']):,} env steps, "
        f"{float(reached['time_s']):.0f} s" if reached else f"no 475 in {args.budget:g} s")
        + f" ({load()})", flush=True)


def plot(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, panels = plt.subplots(1, len(args.dirs), figsize=(6.5 * len(args.dirs), 4.5),
                               squeeze=False)
    for i, (axes, (directory, title)) in enumerate(zip(
            panels[0], zip(args.dirs, args.titles or args.dirs, strict=False), strict=False)):
        align = i in (args.align or [])
        runs = sorted(p for p in Path(directory).iterdir()
                      if (p / "metrics" / "run.csv").exists())
        # runs named alike before their first "-" (seed1-...) share a colour; a run
        # without a surgery (a fresh one) is dashed
        groups = sorted({run.name.split("-")[0] for run in runs})
        marked = set()
        for run_dir in runs:
            data = rows(run_dir)
            at = next((j for j, r in enumerate(data) if r.get("surgery")), None)
            cut = int(data[at]["env_steps"]) if at is not None else None
            if at is not None:  # the first episodes to end after the restart are its
                # shortest (a sample of one to a few): drawn from 20 episodes on
                episodes0 = int(data[at - 1]["episodes"]) if at else 0
                data = data[:at] + [r for r in data[at:]
                                    if int(r["episodes"]) - episodes0 >= 20]
            x0 = cut if align and cut is not None else 0
            kept = [r for r in data if int(r["env_steps"]) >= x0]
            axes.plot([int(r["env_steps"]) - x0 for r in kept],
                      [float(r["return_mean_20"]) for r in kept], label=run_dir.name,
                      lw=1.2, ls="-" if cut is not None else "--",
                      color=f"C{groups.index(run_dir.name.split('-')[0])}")
            if cut is not None and cut - x0 not in marked:
                marked.add(cut - x0)
                axes.axvline(cut - x0, color="k", ls=":", lw=0.8)
                if len(marked) == 1:  # one label a panel
                    axes.annotate("surgery", (cut - x0, 30), rotation=90, fontsize=7)
        axes.set_xlabel("env steps since the surgery (a fresh run: since its start)"
                        if align else "env steps")
        axes.set_ylabel("mean return, last 20 episodes")
        axes.legend(fontsize=8)
        axes.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("same-function", "new-observations"):
        p = sub.add_parser(name)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--budget", type=float, default=300.0)
        p.add_argument("--out")
        p.add_argument("--hidden", default="[128, 128, 128]")
        p.add_argument("--after-s", type=float, default=60.0,
                       help="how long a resumed run goes on (no stop at 475: does it hold?)")
        if name == "new-observations":
            p.add_argument("--plateau-s", type=float, default=60.0)
            p.add_argument("--topology", default=str(SEED),
                           help="the topology masked, carried and run fresh")
    p = sub.add_parser("plot")
    p.add_argument("dirs", nargs="+", help="one panel each")
    p.add_argument("--png", default="docs/surgery.png")
    p.add_argument("--titles", nargs="*", help="one per panel")
    p.add_argument("--align", type=int, nargs="*",
                   help="panels (from 0) drawn from each run's surgery on")
    args = parser.parse_args()
    {"same-function": same_function, "new-observations": new_observations,
     "plot": plot}[args.what](args)


if __name__ == "__main__":
    main()
