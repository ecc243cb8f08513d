"""`describe` on a bound port and `zmqrl endpoints`: what a client in any language needs
to find a port and know what to send it."""

from __future__ import annotations

import subprocess
import sys

from zmqrl.bus import wire

from conftest import wait_for, write_topology

SMALL = {"nodes": {"actor": {"replicas": 2, "args": {"envs": 4}}}}


def test_endpoints_lists_every_port_and_each_describes_itself(processes, client_factory,
                                                               tmp_path):
    topo = write_topology(tmp_path, **SMALL)
    run_dir = tmp_path / "run"
    listing = subprocess.run([sys.executable, "-m", "zmqrl.cli", "endpoints", str(topo),
                              "--run-dir", str(run_dir)], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    table = dict(line.split("\t") for line in listing.splitlines())
    assert set(table) == {"learner.experience", "learner.params", "broker.policy",
                          "supervisor"}
    assert table["broker.policy"].startswith("ipc://") and \
        table["broker.policy"].endswith("/broker-0-policy")
    log = tmp_path / "learner.log"
    processes.zmqrl("node", str(topo), "learner", "--run-dir", str(run_dir), log=log)
    wait_for(lambda: "up (incarnation" in log.read_text(), 60, "the learner to be up")
    client = client_factory(table["learner.experience"])
    reply = client.request(wire.encode(wire.DESCRIBE))
    assert reply.type == wire.DESCRIPTION
    f = reply.fields
    assert f["protocol"] == wire.PROTOCOL_VERSION and f["node"] == "learner"
    assert f["port"] == "experience" and f["kind"] == "learner"
    assert wire.UNROLL in f["accepts"] and wire.PING in f["accepts"]
    assert f["env"] == "CartPole-v1" and f["obs_shape"] == [4] and f["obs_dtype"] == "float32"
    assert f["action_space"] == {"kind": "discrete", "n": 2}
    # the port still serves: a ping gets its pong, with the incarnation credit names too
    pong = client.request(wire.encode(wire.PING, seq=7))
    assert pong.type == wire.PONG and pong.fields["seq"] == 7
    assert isinstance(pong.fields["incarnation"], str)
