"""Nodes forked from the template the supervisor forks of itself (zmqrl.run.forkstart): each
runs the command it was given, in its own session, with its own title, environment and
exit code, its output through the supervisor's pipe; and ``ZMQRL_FORKSERVER=0`` starts
fresh interpreters instead."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import REPO, read_csv, wait_for, write_topology
from runs import rows_of

# Run in a process of its own: the template lives as long as the process that started it.
SCRIPT = r'''
import json, os, signal, sys, time
from zmqrl.run import forkstart

assert forkstart.open_template()
cmd = [sys.executable, "-m", "zmqrl.cli"]
out = {}
ok = forkstart.start(cmd + ["validate", sys.argv[1]], dict(os.environ, MARK="1"))
out["ok"] = [ok.wait(120), ok.stdout.read()]
bad = forkstart.start(cmd + ["node", sys.argv[1], "no_such_node"], dict(os.environ))
out["bad"] = [bad.wait(120), bad.stdout.read()]
# a learner with nothing to learn from runs until it is killed
learner = forkstart.start(cmd + ["node", sys.argv[1], "learner", "--run-dir", sys.argv[2]],
                          dict(os.environ))
# until it reports its first metrics row (it is up and running), or ends
metrics = os.path.join(sys.argv[2], "metrics", "learner.csv")
deadline = time.monotonic() + 120
while learner.poll() is None and not os.path.exists(metrics) and time.monotonic() < deadline:
    time.sleep(0.05)
out["running"] = [learner.poll(), os.path.exists(metrics)]
os.kill(learner.pid, signal.SIGKILL)
out["killed"] = learner.wait(60)
out["template"] = forkstart._template.pid
print(json.dumps(out))
'''


def test_a_forked_command_runs_with_its_output_and_exit_code(tmp_path):
    topo = REPO / "topologies" / "seed.yaml"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(topo), str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    code, text = out["ok"]
    assert code == 0 and "seed" in text, out
    code, text = out["bad"]
    assert code == 2 and "no node 'no_such_node'" in text, out
    assert out["running"] == [None, True] and out["killed"] == -signal.SIGKILL, out
    # the template ended with the process that opened it
    wait_for(lambda: _ended(out["template"]), 10, "the template to end with its supervisor")


def _ended(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _title_and_session(pid: int) -> tuple[bytes, int]:
    cmdline = open(f"/proc/{pid}/cmdline", "rb").read()  # noqa: SIM115
    return cmdline, os.getsid(pid)


def test_up_forks_its_nodes_and_zmqrl_forkserver_0_does_not(processes, tmp_path):
    """Under ``up`` each node is a fork of the template: its title is its command (one
    string), it leads its own session; with ZMQRL_FORKSERVER=0 it is a fresh interpreter
    (the command's words NUL-separated). Both runs step envs, update and stop cleanly."""
    path = write_topology(tmp_path, "a2c.yaml", nodes={"actor": {"replicas": 1}})
    seen = {}
    for switch in ("1", "0"):
        run_dir = tmp_path / f"run-{switch}"
        proc = processes.start([sys.executable, "-m", "zmqrl.cli", "up", str(path),
                                "--run-dir", str(run_dir), "--max-seconds", "90"],
                               log=tmp_path / f"up-{switch}.log",
                               env={"ZMQRL_FORKSERVER": switch})
        pids = {}

        def look(run_dir=run_dir, pids=pids):
            for row in rows_of(run_dir, "learner"):
                if int(row["updates"]) > 0:
                    break
            else:
                return False
            status_file = run_dir / "status" / "learner.json"
            if not status_file.exists():
                return False
            status = json.loads(status_file.read_text())
            pids["learner"] = _title_and_session(status["pid"]) + (status["pid"],)
            return True

        wait_for(look, 90, f"a learner update (ZMQRL_FORKSERVER={switch})", interval=0.5)
        seen[switch] = pids["learner"]
        proc.send_signal(signal.SIGTERM)  # every node stops cleanly: up exits 0
        assert proc.wait(timeout=60) == 0, (tmp_path / f"up-{switch}.log").read_text()[-3000:]
        assert int(read_csv(run_dir / "metrics" / "run.csv")[-1]["env_steps"]) > 0
        # what a user reads: no runpy warning of zmqrl.cli, which each forked child runs
        # again as __main__ after the template imported it
        said = (tmp_path / f"up-{switch}.log").read_text() + "".join(
            log.read_text() for log in (run_dir / "logs").glob("*.log"))
        assert "RuntimeWarning" not in said, said[-3000:]
    for switch, (cmdline, session, pid) in seen.items():
        assert session == pid, switch  # its own session: the supervisor signals its group
        assert b"zmqrl.cli node" in cmdline.replace(b"\0", b" ") and b" learner " in \
            cmdline.replace(b"\0", b" "), cmdline
    assert b"\0" not in seen["1"][0].rstrip(b"\0")  # the title: one string
    assert seen["0"][0].count(b"\0") > 5  # a fresh interpreter's argv


def test_a_killed_template_costs_the_run_only_speed(processes, tmp_path):
    """SIGKILL the template mid-run: its forked nodes die with it, the supervisor restarts
    them, says it cannot fork them any more and starts fresh interpreters, and the
    learner updates again."""
    path = write_topology(tmp_path, "a2c.yaml", nodes={"actor": {"replicas": 1}})
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    proc = processes.start([sys.executable, "-m", "zmqrl.cli", "up", str(path), "--run-dir",
                            str(run_dir), "--max-seconds", "120"], log=log)

    def updates() -> int:
        return max((int(r["updates"]) for r in rows_of(run_dir, "learner")), default=0)

    wait_for(lambda: updates() > 0, 90, "a learner update")
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    template = next(int(p) for p in children
                    if b"fork template" in Path(f"/proc/{p}/cmdline").read_bytes())
    os.kill(template, signal.SIGKILL)
    wait_for(lambda: "starting fresh interpreters" in log.read_text(), 60,
             "the supervisor to start fresh interpreters")
    before = updates()
    wait_for(lambda: updates() > before, 90, "learner updates after the template died")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
