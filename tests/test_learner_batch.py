"""The batch a learner's ``update`` receives from a replay: the item kind's arrays and
the importance weights, named ``weight`` as on the wire; a learner that never reads the
weights of a prioritized batch (a silent uniform update) is counted and told once."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from zmqrl.bus.endpoints import Endpoints
from zmqrl.bus.node import NodeContext
from zmqrl.parts.learning.sources import WEIGHT, ReadTensors
from zmqrl.run.topology import from_dict, load_class

TOPOLOGY = {
    "name": "learner-batch", "env": {"id": "CartPole-v1"},
    "model": {"kind": "dueling_mlp", "hidden": [8]},
    "algo": {"kind": "dqn", "batch_size": 4},
    "nodes": {
        "replay": {"kind": "replay", "args": {"capacity": 64, "min_size": 4}},
        "learner": {"kind": "learner", "args": {"device": "cpu", "checkpoint_every": 0},
                    "links": {"replay": "replay.sample"}},
    },
}


def _learner(tmp_path: Path):
    topo = from_dict(TOPOLOGY)
    spec = topo.nodes["learner"]
    node = load_class(spec.target)(NodeContext(topo, spec, 0, tmp_path,
                                               Endpoints(topo, tmp_path)))
    node._open_sockets()
    node.setup()
    return node


def _batch(weight: list[float]) -> ReadTensors:
    n = len(weight)
    return ReadTensors(obs=torch.zeros(n, 4), action=torch.zeros(n, dtype=torch.int64),
                       reward=torch.ones(n), discount=torch.full((n,), 0.9),
                       next_obs=torch.zeros(n, 4), **{WEIGHT: torch.tensor(weight)})


def test_reads_are_noted():
    batch = _batch([0.5, 1.0])
    batch["obs"]
    batch.get("missing")
    assert batch.read == {"obs", "missing"}
    assert WEIGHT in batch and WEIGHT not in batch.read  # `in` is not a read


def test_a_learner_that_ignores_the_weights_is_told_once(tmp_path, caplog):
    node = _learner(tmp_path)
    try:
        node.updater.step(batch := _batch([0.5, 1.0, 1.0, 0.25]))  # the DQN learner
        node._note_unread_weights(batch)
        assert WEIGHT in batch.read and node.unweighted_batches == 0

        class Unweighted:  # a plug-in's update written against the wrong key
            def update(self, batch):
                batch.get("weights")
                return {"loss": float(batch["reward"].mean())}

        node.updater.bind(Unweighted(), lambda: None)
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                node.updater.step(batch := _batch([0.5, 1.0, 1.0, 0.25]))
                node._note_unread_weights(batch)
            node.updater.step(uniform := _batch([1.0] * 4))  # nothing to ignore
            node._note_unread_weights(uniform)
        assert node.unweighted_batches == 3
        told = [r for r in caplog.records if "never read the batch's 'weight'" in r.message]
        assert len(told) == 1 and "Unweighted" in told[0].message
        assert node.metrics()["unweighted_batches"] == 3
    finally:
        for sock in node.sockets.values():
            sock.close(linger=0)


def test_the_docs_hold_the_batch_tables():
    """docs/extending.md's tables of what ``update(batch)`` receives are the declarations'
    (the array names a learner reads are the code's)."""
    from zmqrl.parts.learning import batch_doc

    text = (Path(__file__).resolve().parent.parent / "docs" / "extending.md").read_text()
    block = text.split(batch_doc.BEGIN)[1].split(batch_doc.END)[0].strip("\n") + "\n"
    assert block == batch_doc.markdown(), (
        "docs/extending.md's batch tables differ from the declarations: regenerate them "
        "with `python -m zmqrl.parts.learning.batch_doc --write docs/extending.md`")
    assert f"| `{WEIGHT}` |" in block and "| `weights` |" not in block
