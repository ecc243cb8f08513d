"""Many-links: a link declared ``Link(..., many=True)`` takes a list of targets and opens
one socket per target (``<link>_<i>``); its handler hears which target spoke. Checked
in the topology, made by the population's expansion for a shared node, and on real
sockets (a node process, with the test's own PUB and ROUTER sockets at the ports the
topology gives)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
import zmq

from zmqrl.bus import wire
from zmqrl.bus.endpoints import Endpoints
from zmqrl.bus.spec import NodeSpec
from zmqrl.run.population import expand
from zmqrl.run.topology import TopologyError, from_dict, load

from conftest import REPO, wait_for

GOOD = yaml.safe_load((REPO / "topologies" / "seed.yaml").read_text())
FEEDS = "tests.nodes_for_tests:ManyFeeds"
REQUESTS = "tests.nodes_for_tests:ManyRequests"


def topology(nodes: dict[str, Any], **more: Any) -> dict[str, Any]:
    """A small topology: ``nodes`` with the seed topology's env (its model and algorithm
    are never built here: the tests run single nodes that train nothing)."""
    return {"name": "many", "env": {"id": "CartPole-v1"}, "nodes": nodes, **more}


def publisher() -> dict[str, Any]:
    """A node the test stands in for: it binds one PUB port (the test binds it)."""
    return {"command": ["true"], "binds": {"params": "pub"}}


def server() -> dict[str, Any]:
    return {"command": ["true"], "binds": {"requests": "router"}}


def errors_of(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(TopologyError) as info:
        from_dict(raw, "t.yaml")
    return info.value.errors


# ----- the spec ---------------------------------------------------------------------------
def test_a_spec_names_the_targets_of_each_link():
    spec = NodeSpec("n", links={"one": "a.p", "many": ["b.p", "c.p"]})
    assert spec.targets("one") == ["a.p"]
    assert spec.targets("many") == ["b.p", "c.p"]
    assert spec.targets("absent") == []
    assert spec.links_to("one", "a.p") and spec.links_to("many", "c.p")
    assert not spec.links_to("many", "a.p") and not spec.links_to("absent", "a.p")


# ----- validation -------------------------------------------------------------------------
def test_a_list_on_a_link_not_declared_many_is_refused():
    raw = json.loads(json.dumps(GOOD))
    raw["nodes"]["actor"]["links"]["policy"] = ["broker.policy", "broker.policy"]
    errors = errors_of(raw)
    assert "t.yaml: node 'actor', field 'links.policy': link 'policy' takes one target " \
        "(node.port), not a list" in errors


def test_every_target_of_a_many_link_is_checked_at_its_place_in_the_list():
    raw = topology({"pub": publisher(), "server": server(),
                    "feeds": {"impl": FEEDS, "links": {
                        "feeds": ["pub.params", "nosuch.params", "pub.parms",
                                  "server.requests"]}}})
    errors = errors_of(raw)
    assert any(e.startswith("t.yaml: node 'feeds', field 'links.feeds.1': 'nosuch.params' "
                            "names no node 'nosuch'") for e in errors), errors
    assert any(e.startswith("t.yaml: node 'feeds', field 'links.feeds.2': node 'pub' binds "
                            "no port 'parms'") for e in errors), errors
    assert "t.yaml: node 'feeds', field 'links.feeds.3': a sub link cannot connect to " \
        "'server.requests', a router port" in errors
    assert not any("links.feeds.0" in e for e in errors), errors
    assert len(errors) == 3, errors


def test_a_many_link_takes_a_single_target_or_a_non_empty_list():
    one = from_dict(topology({"pub": publisher(),
                              "feeds": {"impl": FEEDS, "links": {"feeds": "pub.params"}}}))
    assert one.nodes["feeds"].targets("feeds") == ["pub.params"]
    errors = errors_of(topology({"pub": publisher(),
                                 "feeds": {"impl": FEEDS, "links": {"feeds": []}}}))
    assert any(e.startswith("t.yaml: node 'feeds', field 'links.feeds': [] is neither")
               for e in errors), errors


# ----- the population's expansion ---------------------------------------------------------
def test_a_shared_node_links_to_every_members_copy_in_member_order():
    raw = {"seed": 0,
           "population": {"size": 3, "hyperparameters": {"lr": {"choice": [1e-3]}},
                          "shared": ["broker"]},
           "nodes": {"learner": {"kind": "learner"},
                     "broker": {"kind": "inference_broker",
                                "links": {"params": "learner.params",
                                          "experience": "learner.experience"}},
                     "actor": {"kind": "actor", "links": {"policy": "broker.policy"}}}}
    nodes = expand(raw)["nodes"]
    assert nodes["broker"]["links"] == {
        "params": ["learner_m0.params", "learner_m1.params", "learner_m2.params"],
        "experience": ["learner_m0.experience", "learner_m1.experience",
                       "learner_m2.experience"]}
    for i in range(3):  # a member's link to the shared node stays as written
        assert nodes[f"actor_m{i}"]["links"] == {"policy": "broker.policy"}
        assert nodes[f"learner_m{i}"]["links"] == {"pbt": "pbt.members"}
    assert raw["nodes"]["broker"]["links"]["params"] == "learner.params"  # a copy was made


def test_an_expanded_shared_many_link_loads(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topology(
        {"pub": publisher(), "feeds": {"impl": FEEDS, "links": {"feeds": "pub.params"}}},
        population={"size": 2, "hyperparameters": {"lr": {"choice": [1e-3]}},
                    "shared": ["feeds"]})))
    topo = load(path, node="feeds")
    assert topo.nodes["feeds"].targets("feeds") == ["pub_m0.params", "pub_m1.params"]


def test_the_ray_engine_resolves_every_target_of_a_many_link():
    from types import SimpleNamespace

    from zmqrl.run.engines.placement import Slot
    from zmqrl.run.engines.ray_supervisor import RaySupervisor

    topo = from_dict(topology({"pub_a": publisher(), "pub_b": {**publisher(), "replicas": 2},
                               "feeds": {"impl": FEEDS, "links": {
                                   "feeds": ["pub_a.params", "pub_b.params"]}}}))
    role = RaySupervisor._role(SimpleNamespace(topo=topo), Slot("feeds", 0, "feeds", {}))
    assert role.links == {"pub_a.params": ["pub_a"], "pub_b.params": ["pub_b.0", "pub_b.1"]}


# ----- on real sockets --------------------------------------------------------------------
def write(tmp_path: Path, raw: dict[str, Any]) -> Path:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def bind(kind: int, address: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)  # (Endpoints made the ipc directory)
    return sock


def test_a_many_sub_link_hears_each_publisher_with_its_index(tmp_path, processes):
    path = write(tmp_path, topology({"pub_a": publisher(), "pub_b": publisher(),
                                     "feeds": {"impl": FEEDS,
                                               "links": {"feeds": ["pub_a.params",
                                                                   "pub_b.params"]}}}))
    run_dir = tmp_path / "run"
    endpoints = Endpoints(load(path, node="feeds"), run_dir)
    pubs = [bind(zmq.PUB, endpoints.bind_address(name, "params", 0))
            for name in ("pub_a", "pub_b")]
    log = tmp_path / "feeds.log"
    proc = processes.zmqrl("node", str(path), "feeds", "--run-dir", str(run_dir), log=log)
    heard_file = run_dir / "feeds.feeds.jsonl"

    def heard() -> list[tuple[int, dict]]:
        lines = heard_file.read_text().splitlines() if heard_file.exists() else []
        return [tuple(json.loads(line)) for line in lines]

    def both_heard() -> bool:
        assert proc.poll() is None, log.read_text()
        # A SUB misses what was published before it connected: publish until heard.
        for i, pub in enumerate(pubs):
            pub.send_multipart(wire.encode(wire.PARAMS, version=i, sender=f"pub_{'ab'[i]}"))
        return {index for index, _ in heard()} == {0, 1}

    try:
        wait_for(both_heard, 90, "the node to hear both publishers", interval=0.1)
        for index, fields in heard():
            assert fields["sender"] == f"pub_{'ab'[index]}" and fields["version"] == index
    finally:
        for pub in pubs:
            pub.close()


def test_a_many_dealer_link_sends_on_the_chosen_target_only(tmp_path, processes):
    path = write(tmp_path, topology(
        {"s0": server(), "s1": server(), "s2": server(),
         "asker": {"impl": REQUESTS, "args": {"send_to": [0, 2], "every_s": 0.05},
                   "links": {"out": ["s0.requests", "s1.requests", "s2.requests"]}}},
        network={"heartbeat_s": 0.2, "peer_timeout_s": 2.0}))
    run_dir = tmp_path / "run"
    endpoints = Endpoints(load(path, node="asker"), run_dir)
    routers = [bind(zmq.ROUTER, endpoints.bind_address(f"s{i}", "requests", 0))
               for i in range(3)]
    got: list[list[wire.Message]] = [[], [], []]
    log = tmp_path / "asker.log"
    proc = processes.zmqrl("node", str(path), "asker", "--run-dir", str(run_dir), log=log)
    status = run_dir / "status" / "asker.json"

    def receive() -> None:
        assert proc.poll() is None, log.read_text()
        for i, router in enumerate(routers):
            while router.poll(0):
                identity, *body = router.recv_multipart()
                msg = wire.decode(body)
                got[i].append(msg)
                if msg.type == wire.PING:  # the peer is alive: it hears us answer
                    router.send_multipart([identity, *wire.encode(wire.PONG)])

    def enough() -> bool:
        receive()
        asked = [sum(m.type == wire.GET_PARAMS for m in msgs) for msgs in got]
        pinged = [sum(m.type == wire.PING for m in msgs) for msgs in got]
        return asked[0] >= 5 and asked[2] >= 5 and min(pinged) >= 2

    try:
        wait_for(enough, 90, "requests on targets 0 and 2 and pings on all three",
                 interval=0.02)
        receive()
        for i, msgs in enumerate(got):
            requests = [m for m in msgs if m.type == wire.GET_PARAMS]
            assert all(m.fields["index"] == i for m in requests), (i, requests)
            assert {m.type for m in msgs} <= {wire.GET_PARAMS, wire.PING}
        assert not any(m.type == wire.GET_PARAMS for m in got[1])

        def described() -> dict[str, Any] | None:
            receive()  # keep answering pings meanwhile
            try:
                data = json.loads(status.read_text())
            except (OSError, ValueError):
                return None
            # up for twice the peer timeout: a socket whose pongs went unheard is silent
            return data if data.get("row", {}).get("time_s", 0) >= 4.0 else None

        data = wait_for(described, 60, "the status file of a node up for 4 s", interval=0.02)
        for i in range(3):
            assert data["links"][f"out_{i}"]["role"] == "link"
            assert data["links"][f"out_{i}"]["peer"] == f"s{i}.requests"
        assert data["row"]["silent_peers"] == 0, log.read_text()
    finally:
        for router in routers:
            router.close()
