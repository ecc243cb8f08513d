"""Seeing a run: TensorBoard event files, ``zmqrl status``, ``zmqrl plot``, the progress bar.

Two tiny real A2C runs (CartPole, seeds 1 and 2) run side by side once for the module;
the second with ``ZMQRL_TENSORBOARD=0``. While the first runs, ``zmqrl status --once``
is taken from it; then both are stopped (SIGTERM, as Ctrl-C would) and their files read.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from zmqrl.bus import tensorboard as tb
from zmqrl.cli import main
from zmqrl.run.progress import Progress, _done_text
from zmqrl.run.runmetrics import StopConditions

from conftest import REPO, Processes, machine, read_csv, stop_process, wait_for, write_topology

LABELS = ("learner", "broker", "actor.0", "actor.1")
SOCKETS = {"learner": ("experience", "params"), "broker": ("policy", "experience", "params"),
           "actor.0": ("policy",), "actor.1": ("policy",)}
KINDS = {"learner": "learner", "broker": "inference_broker", "actor.0": "actor",
         "actor.1": "actor"}


@dataclass
class Runs:
    with_tb: Path
    without_tb: Path
    status_live: str  # `zmqrl status --once` while the first run ran
    status_after: str  # and after it stopped


def _status(run_dir: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "zmqrl.cli", "status", str(run_dir), "--once"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _ready(run_dir: Path) -> bool:
    """Every node reported traffic on its sockets, and an episode ended."""
    import json

    for label in LABELS:
        try:
            data = json.loads((run_dir / "status" / f"{label}.json").read_text())
        except (OSError, ValueError):
            return False
        links = data.get("links", {})
        if not all(links.get(s, {}).get("in_per_s") is not None
                   or links.get(s, {}).get("out_per_s") for s in SOCKETS[label][:1]):
            return False
    rows = read_csv(run_dir / "metrics" / "run.csv")
    learned = {r["env_steps"] for r in read_csv(run_dir / "metrics" / "learner.csv")
               if int(r["updates"] or 0) > 0}  # a loaded machine can stall it a while
    return len(learned) >= 2 and bool(rows) and rows[-1]["return_mean_100"] not in ("", "nan")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    tmp = tmp_path_factory.mktemp("observe")
    procs = Processes()
    dirs = []
    try:
        with machine(tmp_path_factory):  # no exclusive test beside these runs
            for seed, env in ((1, {}), (2, {tb.ENV_SWITCH: "0"})):
                topo = write_topology(tmp, "a2c.yaml", seed=seed,
                                      nodes={"actor": {"args": {"envs": 8}}})
                run_dir = tmp / f"run-{seed}"
                procs.start([sys.executable, "-m", "zmqrl.cli", "up", str(topo), "--run-dir",
                             str(run_dir), "--max-seconds", "150"], log=tmp / f"up-{seed}.log",
                            env=env)
                dirs.append(run_dir)
            for run_dir in dirs:
                wait_for(lambda d=run_dir: _ready(d), 120, f"{run_dir.name} to report everything")
            live = _status(dirs[0])
            for proc in procs.procs:  # Ctrl-C's way: the supervisor stops every node cleanly
                os.killpg(proc.pid, signal.SIGTERM)
            for proc, seed in zip(procs.procs, (1, 2), strict=True):
                assert proc.wait(timeout=60) == 0, (tmp / f"up-{seed}.log").read_text()[-3000:]
            return Runs(dirs[0], dirs[1], live, _status(dirs[0]))
    finally:
        for proc in procs.procs:
            stop_process(proc)


# ----- TensorBoard ---------------------------------------------------------------------
def _scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator")
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def test_event_files_hold_the_expected_tags_against_env_steps(runs):
    pytest.importorskip("tensorboard")
    expected = {
        "learner": {"charts/episodic_return", "charts/sps", "charts/policy_lag",
                    "charts/updates", "losses/loss_total", "losses/loss_policy",
                    "edges/experience/in_msgs_per_s", "edges/params/out_msgs_per_s"},
        "broker": {"broker/batch_envs_mean", "broker/latency_p50_ms",
                   "edges/policy/in_msgs_per_s", "edges/experience/queue",
                   "edges/experience/out_msgs_per_s"},
        "actor.0": {"charts/episodic_return", "edges/policy/out_msgs_per_s",
                    "node/bad_messages"},
        "run": {"charts/episodic_return", "charts/episodic_return_20", "charts/sps",
                "charts/episodes"},
    }
    for label, tags in expected.items():
        scalars = _scalars(runs.with_tb / "tb" / label)
        assert tags <= set(scalars), (label, sorted(tags - set(scalars)))
        steps = [s for s, _ in scalars[sorted(tags)[0]]]
        assert steps == sorted(steps) and steps[-1] > 0, (label, steps)
    # the x axis is env steps: the learner's steps are its CSV's env_steps
    rows = read_csv(runs.with_tb / "metrics" / "learner.csv")
    csv_steps = {int(r["env_steps"]) for r in rows}
    tb_steps = {s for s, _ in _scalars(runs.with_tb / "tb" / "learner")["charts/updates"]}
    assert tb_steps <= csv_steps and len(tb_steps) >= 2
    run_rows = read_csv(runs.with_tb / "metrics" / "run.csv")
    last_return = [v for s, v in _scalars(runs.with_tb / "tb" / "run")["charts/episodic_return"]]
    assert last_return[-1] == pytest.approx(float(run_rows[-1]["return_mean_100"]), abs=0.01)


def test_csvs_are_complete_without_tensorboard(runs):
    """Every tag comes from a CSV column; a run with the writers off has the same CSVs."""
    pytest.importorskip("tensorboard")
    for label in LABELS:
        header = list(read_csv(runs.with_tb / "metrics" / f"{label}.csv")[-1])
        from_csv = {tb.tag_of(c, KINDS[label], SOCKETS[label]) for c in header}
        assert set(_scalars(runs.with_tb / "tb" / label)) <= from_csv, label
        off = read_csv(runs.without_tb / "metrics" / f"{label}.csv")
        assert off and set(header) - set(off[-1]) <= {
            c for c in header if c.endswith(("_per_s", "_queue"))}, label
    assert not (runs.without_tb / "tb").exists()


def test_tags_are_named_as_rl_users_expect():
    links = ("experience", "params", "experience_1")
    assert tb.tag_of("return_mean_100", "learner", links) == "charts/episodic_return"
    assert tb.tag_of("steps_per_s", "learner", links) == "charts/sps"
    assert tb.tag_of("loss_policy", "learner", links) == "losses/loss_policy"
    assert tb.tag_of("queue", "learner", links) == "learner/queue"
    assert tb.tag_of("experience_1_msgs_per_s", "actor", links) == \
        "edges/experience_1/msgs_per_s"
    assert tb.tag_of("experience_in_msgs_per_s", "actor", links) == \
        "edges/experience/in_msgs_per_s"
    assert tb.tag_of("latency_p99_ms", "inference_broker", links) == "broker/latency_p99_ms"
    assert tb.tag_of("fill", "replay", links) == "replay/fill"
    assert tb.tag_of("env_steps", "actor", links) is None
    assert tb.scalars({"return_mean_100": float("nan"), "params_digest": "ab12",
                       "dropped": 0}, "actor") == {"node/dropped": 0.0}
    assert tb.step_of({"env_steps": 0, "updates": 7}) == 7  # a replay-fed learner


# ----- zmqrl status ---------------------------------------------------------------------
def _node_block(text: str, label: str) -> list[str]:
    """The table lines of one node: its first line and the socket lines under it."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [label])
    block = [lines[start]]
    for line in lines[start + 1:]:
        if line.strip() and not line.startswith(" "):
            break
        block.append(line)
    return block


def test_status_once_lists_every_node_with_its_links(runs):
    text = runs.status_live
    assert "a2c-cartpole" in text and "supervisor: pid" in text, text
    assert f"host {socket.gethostname()}" in text.splitlines()[0]  # one host: said once
    header = text.splitlines()[1].split()
    for column in ("pid", "inc", "state", "rst", "steps/s", "socket", "peer", "in/s",
                   "out/s", "bytes/s", "queue", "batch", "lag", "age"):
        assert column in header, (column, text)
    for label in LABELS:
        block = _node_block(text, label)
        assert "alive" in block[0], (label, text)
        words = " ".join(block).split()
        assert set(SOCKETS[label]) <= set(words), (label, text)
    assert "-> broker.policy" in "\n".join(_node_block(text, "actor.1"))
    assert "-> learner.experience" in "\n".join(_node_block(text, "broker"))
    assert "/16 (" in _node_block(text, "broker")[0]  # batch fill of the actors' 16 envs


def test_status_after_the_run_says_stopped(runs):
    for label in LABELS:
        assert "stopped" in _node_block(runs.status_after, label)[0], runs.status_after
    assert "supervisor: gone" in runs.status_after


# ----- zmqrl plot -----------------------------------------------------------------------
def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_plot_writes_a_png_of_the_asked_size(runs, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "curves.png"
    result = CliRunner().invoke(main, ["plot", str(runs.with_tb), str(runs.without_tb),
                                       "-o", str(out), "--size", "900x400"])
    assert result.exit_code == 0, result.output
    assert _png_size(out) == (900, 400)
    result = CliRunner().invoke(main, ["plot", str(runs.with_tb), "-o", str(out)])
    assert result.exit_code == 0 and _png_size(out) == (1200, 450), result.output


def test_plot_groups_seeds_by_topology(runs):
    from zmqrl.run.plot import group, load_curve

    one, two = load_curve(runs.with_tb), load_curve(runs.without_tb)
    assert one.steps[-1] > 0 and (one.seconds == sorted(one.seconds)).all()
    assert list(group([one, two])) == ["a2c-cartpole"]  # two seeds, one mean
    two.name = "impala-cartpole"
    assert sorted(group([one, two])) == ["a2c-cartpole", "impala-cartpole"]


def test_plot_adds_a_row_per_learner_metric_and_counts_frames(runs, tmp_path):
    pytest.importorskip("matplotlib")
    from zmqrl.run.plot import load_learner_curve

    entropy = load_learner_curve(runs.with_tb, "entropy")
    rows = read_csv(runs.with_tb / "metrics" / "learner.csv")
    drawn = [r for r in rows if r.get("entropy") and r.get("env_steps")]
    assert len(entropy.returns) == len(drawn) > 0
    assert entropy.returns[-1] == pytest.approx(float(drawn[-1]["entropy"]))
    assert entropy.name == "a2c-cartpole"
    assert (entropy.seconds == sorted(entropy.seconds)).all()  # on the run's clock
    out = tmp_path / "two-rows.png"
    result = CliRunner().invoke(main, ["plot", str(runs.with_tb), "-o", str(out), "--size",
                                       "800x600", "--learner-metric", "entropy",
                                       "--frame-skip", "4"])
    assert result.exit_code == 0, result.output
    assert _png_size(out) == (800, 600)
    result = CliRunner().invoke(main, ["plot", str(runs.with_tb), "-o", str(out),
                                       "--learner-metric", "no_such_column"])
    assert result.exit_code != 0 and "no learner column 'no_such_column'" in result.output


def test_plot_says_what_is_missing(tmp_path):
    result = CliRunner().invoke(main, ["plot", str(tmp_path), "-o", str(tmp_path / "x.png")])
    assert result.exit_code != 0 and "no return_mean_100 to plot" in result.output


# ----- the progress bar -----------------------------------------------------------------
class _Run:
    """What Progress reads of RunMetrics."""

    def __init__(self, stop: StopConditions):
        self.stop, self.total_env_steps, self.base_env_steps = stop, 0, 0
        self.returns: list[float] = []
        self.base_episodes = self.episodes = self.rejected = 0
        self.learner_row: dict = {}

    def mean_return(self, last: int | None = None) -> float:
        return sum(self.returns) / len(self.returns) if self.returns else float("nan")

    def shown(self) -> dict[str, float]:
        return {}  # no node asked for fields of its own


def test_progress_shows_fraction_done_and_time_left():
    run = _Run(StopConditions(max_steps=10_000))
    progress = Progress(run, time.monotonic() - 2.0)
    run.total_env_steps = 4_000
    progress.line()  # measures the rate: 4000 steps in 2 s
    fraction, left = progress.done()
    assert fraction == pytest.approx(0.4) and left == pytest.approx(3.0, rel=0.1)
    assert "40% done, 0:03 left" in progress.line().plain
    assert Progress(_Run(StopConditions()), time.monotonic()).done() is None
    target = _Run(StopConditions(target_return=200.0, window=4))
    assert Progress(target, time.monotonic()).done() == (0.0, None)
    target.returns = [100.0, 50.0, 150.0, 100.0]
    assert Progress(target, time.monotonic()).done() == (0.5, None)
    assert _done_text(0.25, 3725) == "25% done, 1:02:05 left"


def test_the_live_view_draws_a_bar_under_the_line():
    import io

    from rich.console import Console

    run = _Run(StopConditions(max_steps=10_000))
    run.total_env_steps = 2_500
    out = io.StringIO()
    Console(file=out, width=160, force_terminal=True).print(
        Progress(run, time.monotonic() - 1.0).view())
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "env steps 2,500" in lines[0], lines
    assert "━" in lines[1] and "25% done" in lines[1], lines
    assert "done" not in lines[0]  # said once, beside the bar


def test_states_from_the_files_without_a_supervisor(tmp_path):
    """A honcho run's view: the nodes' own files, their pids and ages say the state."""
    import json

    from zmqrl.bus.status import NodeStatus, snapshot, write_supervisor

    def node(label: str, incarnation: str = "a") -> NodeStatus:
        return NodeStatus(tmp_path, label, label, 0, "actor", incarnation, 2.0,
                          "a2c-cartpole", "CartPole-v1")

    def edit(label: str, **fields) -> None:
        path = tmp_path / "status" / f"{label}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))

    def states() -> dict[str, str]:
        return {n.label: n.state for n in snapshot(tmp_path).nodes}

    dead = subprocess.Popen(["true"])
    dead.wait()
    for label in ("alive", "silent", "down", "stopped"):
        status = node(label)
        status.write({"env_steps": 10}, {"policy": {"role": "link", "peer": "broker.policy",
                                                    "in_per_s": 5.0, "out_per_s": 5.0}})
        status._writer.shutdown(wait=True)  # the file is written by a thread
    edit("silent", updated_at=time.time() - 60)
    edit("down", pid=dead.pid)
    node("stopped").stopped(clean=True)
    view = snapshot(tmp_path)
    assert view.name == "a2c-cartpole" and view.supervisor == "none"
    assert states() == {"alive": "alive", "silent": "silent", "down": "down",
                        "stopped": "stopped"}
    assert view.nodes[0].links[0].peer == "broker.policy"
    # a new process for a label: a restart after a crash, not after a clean stop
    node("down").stopped(clean=False)
    assert node("down", "b").data["restarts"] == 1
    assert node("stopped", "b").data["restarts"] == 0
    # the supervisor of `zmqrl up` knows what no node can say
    write_supervisor(tmp_path, {"down": {"state": "restarting", "starts": 2},
                                "silent": {"state": "failed", "starts": 1}})
    assert states()["down"] == "restarting" and states()["silent"] == "failed"
    assert snapshot(tmp_path).supervisor.startswith("pid ")


def test_a_narrow_terminal_loses_columns_not_letters(tmp_path):
    import io

    from rich.console import Console

    from zmqrl.bus.status import NodeStatus, render, snapshot

    status = NodeStatus(tmp_path, "broker.12", "broker", 12,
                        "inference_broker", "abcdef123456", 2.0, "seed-cartpole", "CartPole-v1")
    status.write({"env_steps": 10, "batch_envs_mean": 31.5},
                 {"policy": {"role": "bind", "peer": "router", "in_per_s": 1234.0,
                             "out_per_s": 1234.0, "bytes_per_s": 5e6}})
    status.stopped(clean=False)
    for width in (200, 100, 80):
        out = io.StringIO()
        Console(file=out, width=width).print(render(snapshot(tmp_path), width))
        lines = out.getvalue().splitlines()  # the header line may wrap; the table may not
        table = lines[next(i for i, line in enumerate(lines) if line.startswith("node")):]
        assert "…" not in out.getvalue() and max(map(len, table)) <= width, out.getvalue()
        for column in ("node", "state", "rst", "socket", "in/s", "out/s"):
            assert column in table[0].split(), (width, table[0])


def test_progress_shows_what_nodes_ask_for_and_no_return_without_episodes():
    """A search run's nodes show games and simulations/s and a league its win rate; with
    no episode reported, the line shows no return (self-play's means nothing)."""
    run = _Run(StopConditions())
    run.shown = lambda: {"games": 1234.0, "sims_per_s": 44918.3, "eval/win_rate_mcts": 0.625}
    line = Progress(run, time.monotonic()).line().plain
    assert "games 1,234 | sims_per_s 44,918 | eval/win_rate_mcts 0.625" in line
    assert "return" not in line and "episodes" not in line
    run.episodes = 3
    assert "episodes 3 | return(20)" in Progress(run, time.monotonic()).line().plain
