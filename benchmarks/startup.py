"""How fast a topology starts: nodes forked from the preloaded template against a fresh
interpreter per node (``ZMQRL_FORKSERVER=0``), alternated run by run so the machine's
drift falls on both.

    python benchmarks/startup.py topologies/seed.yaml topologies/pbt_seed.yaml --pairs 4

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


def one_run(topology: str, forked: bool, timeout_s: float) -> tuple[float, float]:
    """(seconds to the first update, CPU seconds of the tree by then)."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        env = dict(os.environ, ZMQRL_FORKSERVER="1" if forked else "0")
        start = time.monotonic()
        up = subprocess.Popen([sys.executable, "-m", "zmqrl.cli", "up", topology, "--run-dir",
                               str(run_dir), "--max-seconds", str(timeout_s)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                              start_new_session=True)
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
    p.add_argument("topologies", nargs="+")
    p.add_argument("--pairs", type=int, default=4, help="forked/fresh pairs per topology")
    p.add_argument("--timeout-s", type=float, default=120.0)
    args = p.parse_args()
    for topology in args.topologies:
        runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for i in range(args.pairs):
            order = (True, False) if i % 2 == 0 else (False, True)
            for forked in order:
                runs[forked].append(one_run(topology, forked, args.timeout_s))
        print(f"{topology}:")
        for forked, name in ((True, "forked"), (False, "fresh ")):
            secs = [r[0] for r in runs[forked]]
            cpus = [r[1] for r in runs[forked]]
            print(f"  {name}: first update {statistics.median(secs):5.1f} s, CPU by then "
                  f"{statistics.median(cpus):5.1f} s   (runs: "
                  + ", ".join(f"{s:.1f} s/{c:.1f} cpu" for s, c in runs[forked]) + ")")
        med = {f: [statistics.median(r[k] for r in runs[f]) for k in (0, 1)] for f in runs}
        print(f"  fresh/forked: time {med[False][0] / med[True][0]:.2f}x, "
              f"CPU {med[False][1] / med[True][1]:.2f}x")


if __name__ == "__main__":
    main()
