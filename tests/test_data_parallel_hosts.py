"""Two data-parallel learner nodes with ``host:`` on one host would both meet on
``network.base_port - 1`` (issue 29, Low 8): ``validate`` refuses it, naming both nodes
and the port; on two hosts, or one of them a single replica, it loads."""

from __future__ import annotations

import pytest

from zmqrl.run.topology import TopologyError, load

from conftest import write_topology


def _two_learners(tmp_path, second_host: str, second_replicas: int = 2):
    learner = {"kind": "learner", "replicas": 2, "host": "127.0.0.1"}
    return write_topology(tmp_path, "ppo.yaml", network={"base_port": 41000}, nodes={
        "learner": learner,
        "learner2": {**learner, "host": second_host, "replicas": second_replicas}})


def test_two_data_parallel_learners_on_one_host_are_refused(tmp_path):
    with pytest.raises(TopologyError) as refused:
        load(_two_learners(tmp_path, "127.0.0.1"))
    text = str(refused.value)
    assert "'learner' and 'learner2'" in text and "port 40999" in text, text


def test_data_parallel_learners_on_two_hosts_or_one_replica_load(tmp_path):
    load(_two_learners(tmp_path, "10.0.0.2"))
    load(_two_learners(tmp_path, "127.0.0.1", second_replicas=1))
