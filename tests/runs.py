"""Real runs of a topology file from the tests: start ``zmqrl up``, read what its nodes
wrote under ``metrics/``, and stop it the moment a test has what it needs.

A run that is only asked to move data and update (no return to reach) stops as soon as
every link has carried data and the learner has updated, instead of lasting a fixed time:
on a loaded machine it takes longer, never a different path, and on a quiet one it frees
the cores for the next test.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from pathlib import Path

from zmqrl.run.topology import Topology

from conftest import read_csv, wait_for


def rows_of(run_dir: Path, node: str) -> list[dict[str, str]]:
    """Metric rows of every replica of ``node``."""
    rows = []
    for path in sorted((run_dir / "metrics").glob("*.csv")):
        if path.stem == node or path.stem.startswith(f"{node}."):
            rows += read_csv(path)
    return rows


def moved(rows: list[dict[str, str]], socket: str) -> bool:
    """Whether any row counts a message on ``socket``."""
    column = f"{socket}_msgs_per_s"
    return any(float(r.get(column) or 0) > 0 for r in rows)


def links_not_moved(topo: Topology, run_dir: Path) -> list[str]:
    """Every ``node.link -> target`` of the topology on which no message was counted, at
    either end."""
    missing = []
    for name, spec in topo.nodes.items():
        for link, target in spec.links.items():
            node, port = target.split(".")
            if not moved(rows_of(run_dir, name), link) or not moved(rows_of(run_dir, node), port):
                missing.append(f"{name}.{link} -> {target}")
    return missing


def most_updates(topo: Topology, run_dir: Path) -> int:
    """The most updates any node counted (a learner, a parameter server: whichever does)."""
    return max((int(float(r["updates"])) for node in topo.nodes for r in rows_of(run_dir, node)
                if r.get("updates")), default=0)


def moved_and_updated(topo: Topology, min_updates: int) -> Callable[[Path], bool]:
    """A ``ready`` for :func:`run_until`: data crossed every link and the learner updated
    ``min_updates`` times."""
    return lambda run_dir: (most_updates(topo, run_dir) >= min_updates
                            and not links_not_moved(topo, run_dir))


def run_until(processes, path: Path, run_dir: Path, log: Path,
              ready: Callable[[Path], object], budget: float,
              args: Sequence[str] = ()) -> str:
    """``zmqrl up path`` until ``ready(run_dir)`` holds (polled each second), then SIGTERM:
    every node stops and checkpoints, and ``up`` must exit 0. ``budget`` seconds bound a
    run that never gets there (``--max-seconds``: the caller's assertions then say what
    is missing). Returns ``up``'s log."""
    proc = processes.zmqrl("up", str(path), "--run-dir", str(run_dir),
                           "--max-seconds", str(budget), *args, log=log)
    wait_for(lambda: proc.poll() is not None or ready(run_dir), budget + 30,
             f"{path.name}: the run to get what the test asks", interval=1.0)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    return log.read_text()


def assert_data_crossed_every_link(topo: Topology, run_dir: Path) -> None:
    missing = links_not_moved(topo, run_dir)
    assert not missing, f"nothing moved on {', '.join(missing)}"
