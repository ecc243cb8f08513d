"""How fast a topology starts: nodes forked from the preloaded template against a fresh
interpreter per node (``ZMQRL_FORKSERVER=0``), alternated run by run so the machine's
drift falls on both.

    python benchmarks/startup.py topologies/seed.yaml topologies/pbt_seed.yaml --pairs 4
    python benchmarks/startup.py topologies/seed.yaml --before ../zmqrl-old   # forked both

With ``--before CHECKOUT`` the two sides are this checkout and that one, both forked
(each run from its checkout's directory, so ``python -m zmqrl.cli`` imports that
checkout's package first): a change to the start-up path measured in one sitting.

Per run: seconds from launching ``zmqrl up`` until the first learner update appears in
its metrics, and the CPU seconds the whole process tree (supervisor, template, nodes)
had used by then (sampled from /proc every 0.2 s). Reported per topology: the median of
each mode and the ratio fresh/forked of the medians, with every run's figures.
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            text = Path(f"/proc/{pid}/task/{task}/children").read_text()
            found += [int(p) for p in text.split()]
    except OSError:
        pass
    return found


def _cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def _first_update(run_dir: Path) -> bool:
    for path in (run_dir / "metrics").glob("learner*.csv"):
        with open(path) as f:
            if any(float(r.get("updates") or 0) > 0 for r in csv.DictReader(f)):
                return True
    return False


def one_run(topology: str, forked: bool, timeout_s: float,
            checkout: Path | None = None) -> tuple[float, float]:
    """(seconds to the first update, CPU seconds of the tree by then), of this checkout
    or of ``checkout``."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        env = dict(os.environ, ZMQRL_FORKSERVER="1" if forked else "0")
        cwd = checkout or Path.cwd()
        if checkout is not None:
            env["PYTHONPATH"] = str(checkout)
        start = time.monotonic()
        up = subprocess.Popen([sys.executable, "-m", "zmqrl.cli", "up", topology, "--run-dir",
                               str(run_dir), "--max-seconds", str(timeout_s)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                              start_new_session=True, cwd=cwd)
        cpu: dict[int, float] = {}
        try:
            while time.monotonic() - start < timeout_s:
                todo = [up.pid]
                while todo:
                    pid = todo.pop()
                    used = _cpu_s(pid)
                    if used is not None:
                        cpu[pid] = max(cpu.get(pid, 0.0), used)
                    todo += _children(pid)
                if _first_update(run_dir):
                    return time.monotonic() - start, sum(cpu.values())
                time.sleep(0.2)
            raise RuntimeError(f"{topology}: no learner update in {timeout_s:.0f} s")
        finally:
            up.send_signal(signal.SIGTERM)
            up.wait(60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("topologies", nargs="+", help="paths relative to each checkout")
    p.add_argument("--pairs", type=int, default=4, help="runs of each side per topology")
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--before", type=Path, help="another checkout: compare its forked start "
                   "with this one's (instead of forked with fresh)")
    args = p.parse_args()
    before = args.before.resolve() if args.before else None
    # side: (label, forked, checkout); the first is the one the ratio divides by
    sides = ([("this", True, None), ("before", True, before)] if before else
             [("forked", True, None), ("fresh", False, None)])
    for topology in args.topologies:
        runs: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in sides}
        for i in range(args.pairs):
            for label, forked, checkout in (sides if i % 2 == 0 else sides[::-1]):
                runs[label].append(one_run(topology, forked, args.timeout_s, checkout))
        print(f"{topology}:")
        for label, _, _ in sides:
            secs = [r[0] for r in runs[label]]
            cpus = [r[1] for r in runs[label]]
            print(f"  {label:>6}: first update {statistics.median(secs):5.1f} s, CPU by then "
                  f"{statistics.median(cpus):5.1f} s   (runs: "
                  + ", ".join(f"{s:.1f} s/{c:.1f} cpu" for s, c in runs[label]) + ")")
        med = {label: [statistics.median(r[k] for r in runs[label]) for k in (0, 1)]
               for label in runs}
        (mine, _, _), (other, _, _) = sides
        print(f"  {other}/{mine}: time {med[other][0] / med[mine][0]:.2f}x, "
              f"CPU {med[other][1] / med[mine][1]:.2f}x")


if __name__ == "__main__":
    main()
