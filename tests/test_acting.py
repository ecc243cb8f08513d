"""The acting spine: behaviours batched over connections act exactly as each alone,
keep their recurrent state apart, cut their items, and explore with the ε a step
header gives them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from zmqrl.bus import wire
from zmqrl.parts.acting import (
    ActingSetup,
    ActorCriticBehaviour,
    EpsilonGreedyBehaviour,
    RecurrentQBehaviour,
    act_batched,
    behaviour_for,
    behaviour_type,
)
from zmqrl.parts.actor_critic.config import VTraceConfig
from zmqrl.parts.dqn.config import DQNConfig
from zmqrl.parts.envs import EnvSpec
from zmqrl.parts.models import build_model
from zmqrl.parts.r2d2.config import R2D2Config

REPO = Path(__file__).resolve().parents[1]
SPEC = EnvSpec(obs_shape=(4,), obs_dtype=np.dtype(np.float32), action_shape=(),
               action_dtype=np.dtype(np.int64), num_actions=3)
H = 8


def setup_for(kind: str, cfg, epsilon: float = 0.0, seed: int = 0) -> ActingSetup:
    options = {"hidden": [16], "lstm": H} if kind.startswith("lstm") else {"hidden": [16]}
    model = build_model({"kind": kind, **options}, SPEC, 0)
    return ActingSetup(SPEC, model, cfg, epsilon, seed)


def obs_of(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.normal(size=(n, 4)).astype(np.float32)


def step_all(behaviours, obs, version=0):
    for b, o in zip(behaviours, obs, strict=True):
        b.observe(o)
    return act_batched(behaviours[0].model, behaviours, version)


@pytest.mark.parametrize(("kind", "cls", "cfg"), [
    ("dueling_mlp", EpsilonGreedyBehaviour, DQNConfig()),
    ("lstm_q", RecurrentQBehaviour, R2D2Config(sequence_length=4, burn_in=1, overlap=1)),
])
def test_greedy_actions_batched_over_connections_equal_each_alone(kind, cls, cfg):
    """One forward pass over three connections (of 2, 3 and 1 envs) gives every
    connection the actions and, for a recurrent Q-network, the state it would have
    had acting alone: state is per connection, not mixed by the batching."""
    setup = setup_for(kind, cfg)
    rng = np.random.default_rng(0)
    together = [cls(setup, n) for n in (2, 3, 1)]
    alone = [cls(setup, n) for n in (2, 3, 1)]
    for t in range(5):
        obs = [obs_of(b.n, rng) for b in together]
        batched = step_all(together, obs)
        single = [step_all([b], [o])[0] for b, o in zip(alone, obs, strict=True)]
        for a, b in zip(batched, single, strict=True):
            np.testing.assert_array_equal(a, b)
        done = [np.zeros(b.n, bool) for b in together]
        done[1][t % 3] = True  # an episode ends in one env of the middle connection
        for group in (together, alone):
            for b, d in zip(group, done, strict=True):
                b.outcome(np.ones(b.n, np.float32), d, np.zeros(b.n, bool),
                          np.zeros((0, 4), np.float32))
        if cls is RecurrentQBehaviour:
            for x, y in zip(together, alone, strict=True):
                np.testing.assert_allclose(x.envs.h, y.envs.h, atol=1e-6)
                np.testing.assert_array_equal(x.envs.first, y.envs.first)


def test_recurrent_policy_state_stays_with_its_connection():
    """lstm_ac: the state each connection advances to depends on its own observations
    only (what model.step gives for that connection alone), and each unroll carries the
    state its first step acted with, and the version that took that step."""
    setup = setup_for("lstm_ac", VTraceConfig(unroll=3))
    rng = np.random.default_rng(1)
    conns = [ActorCriticBehaviour(setup, n) for n in (2, 3)]
    h = [torch.zeros(b.n, H) for b in conns]
    c = [torch.zeros(b.n, H) for b in conns]
    state_after = []  # connection 1's state after each step
    unrolls = []
    for t in range(7):
        obs = [obs_of(b.n, rng) for b in conns]
        for b, o in zip(conns, obs, strict=True):
            b.observe(o)
            unrolls += [item for item in b.take() if b.n == 3]
        act_batched(setup.model, conns, 10 + t)
        for i, (b, o) in enumerate(zip(conns, obs, strict=True)):
            first = torch.full((b.n,), t == 0)
            _, _, (h[i], c[i]) = setup.model.step(torch.from_numpy(o), first, (h[i], c[i]))
            np.testing.assert_allclose(b.state.h, h[i].numpy(), atol=1e-5)
            b.outcome(np.ones(b.n, np.float32), np.zeros(b.n, bool), np.zeros(b.n, bool),
                      np.zeros((0, 4), np.float32))
        state_after.append(h[1].numpy().copy())
    assert [u.type for u in unrolls] == [wire.UNROLL, wire.UNROLL]
    first, second = (u.arrays for u in unrolls)
    assert first["obs"].shape == (4, 3, 4) and first["state_h"].shape == (1, 3, H)
    assert not first["state_h"].any()  # the first unroll starts from the zero state
    np.testing.assert_allclose(second["state_h"][0], state_after[2], atol=1e-5)
    assert [u.fields["version"] for u in unrolls] == [10, 13]


def test_step_header_epsilon_makes_the_broker_explore_as_the_actor_would():
    setup = setup_for("dueling_mlp", DQNConfig(), epsilon=0.0)
    rng = np.random.default_rng(2)
    b = EpsilonGreedyBehaviour(setup, 200)
    obs = obs_of(200, rng)
    b.observe(obs)
    (greedy,) = act_batched(setup.model, [b], 0)
    b.outcome(np.zeros(200, np.float32), np.zeros(200, bool), np.zeros(200, bool),
              np.zeros((0, 4), np.float32))
    b.observe(obs, {"epsilon": 1.0})
    (explored,) = act_batched(setup.model, [b], 0)
    assert b.epsilon == 1.0
    assert (explored != greedy).mean() > 0.4  # 2 of 3 random actions differ from greedy


def test_transitions_bootstrap_from_the_final_observation_of_a_cut_episode():
    """n_step 1: an env cut by a time limit ships its final observation as next_obs with
    the discount; a terminated one ships discount 0; the others the next observation."""
    setup = setup_for("dueling_mlp", DQNConfig(n_step=1, discount=0.9))
    b = EpsilonGreedyBehaviour(setup, 3)
    obs0 = np.zeros((3, 4), np.float32)
    obs1 = np.ones((3, 4), np.float32)
    final = np.full((1, 4), 5.0, np.float32)
    b.observe(obs0)
    act_batched(setup.model, [b], 3)
    b.outcome(np.ones(3, np.float32), np.array([False, True, True]),
              np.array([False, False, True]), final)
    b.observe(obs1)
    (item,) = b.take()
    assert item.type == wire.INSERT and item.fields["version"] == 3
    np.testing.assert_allclose(item.arrays["discount"], [0.9, 0.0, 0.9])
    np.testing.assert_array_equal(item.arrays["next_obs"][0], obs1[0])
    np.testing.assert_array_equal(item.arrays["next_obs"][2], final[0])
    assert item.arrays["priority"].shape == (3,) and (item.arrays["priority"] >= 0).all()


def test_inserts_wait_for_insert_batch_and_carry_priorities_only_when_asked():
    """insert_batch 6 with 3 envs and n_step 1: the first step's 3 transitions wait, the
    second step ships all 6 in one insert. Without ``priorities`` (a uniform replay)
    the insert has no priority array, which the replay then fills in itself."""
    for priorities in (True, False):
        setup = setup_for("dueling_mlp", DQNConfig(n_step=1))
        setup.priorities, setup.insert_batch = priorities, 6
        b = EpsilonGreedyBehaviour(setup, 3)
        rng = np.random.default_rng(0)
        b.observe(obs_of(3, rng))
        shipped = []
        for _ in range(2):
            act_batched(setup.model, [b], 0)
            b.outcome(np.ones(3, np.float32), np.zeros(3, bool), np.zeros(3, bool),
                      np.zeros((0, 4), np.float32))
            b.observe(obs_of(3, rng))
            shipped.append(b.take())
        assert shipped[0] == []
        (item,) = shipped[1]
        assert item.arrays["action"].shape == (6,)
        assert ("priority" in item.arrays) is priorities


def test_only_a_prioritized_replay_is_sent_priorities(tmp_path):
    from zmqrl.parts.dqn.acting import replay_samples_by_priority
    from zmqrl.run.topology import load as load_topology

    apex = load_topology(REPO / "topologies" / "apex.yaml")
    # gorila.yaml samples by priority; the Gorila paper's uniform replay is one line away
    text = (REPO / "topologies" / "gorila.yaml").read_text()
    assert "sampler: prioritized" in text
    (tmp_path / "gorila.yaml").write_text(text.replace("sampler: prioritized",
                                                       "sampler: uniform"))
    gorila = load_topology(tmp_path / "gorila.yaml")
    assert replay_samples_by_priority(apex, apex.nodes["actor"].links["experience"])
    assert not replay_samples_by_priority(gorila, gorila.nodes["actor"].links["experience"])
    assert replay_samples_by_priority(gorila, "elsewhere.experience")  # unknown: send them


def test_each_registered_algorithm_names_a_behaviour_shipping_what_its_learner_takes():
    """Whatever algorithms are registered (built-in or plug-in), the behaviour the broker
    and the local actor both resolve for each ships what its consumer takes: unrolls to
    an unroll learner, inserts to a replay, gradients to a parameter server (A3C)."""
    from zmqrl.parts.algo_config import CONFIGS, UNROLLS

    for kind, cfg in CONFIGS.items():
        ships = behaviour_for(cfg).ships
        if cfg.items == UNROLLS:
            assert ships == wire.UNROLL, kind
        else:  # a replay's items (a search's actor ships the games itself)
            assert ships in (wire.INSERT, ""), kind
        if cfg.gradient_behaviour is not None:
            assert behaviour_for(cfg, "param_server").ships == wire.GRADS, kind
    # The shorthand by family names the behaviour its registered algorithms share, and
    # asks for the algorithm where they differ (a plug-in may add another: the set of
    # parts is open, so this reads what is registered).
    families: dict[str, set] = {}
    for cfg in CONFIGS.values():
        families.setdefault(cfg.family, set()).add((cfg.behaviour, cfg.gradient_behaviour))
    for family, choices in families.items():
        if len(choices) == 1:
            [(name, gradients)] = choices
            assert behaviour_for(family) is behaviour_type(name), family
            if gradients is not None:
                assert behaviour_for(family, "param_server") is behaviour_type(gradients)
        else:
            with pytest.raises(ValueError, match="name the algorithm"):
                behaviour_for(family)
    assert behaviour_for(CONFIGS["dqn"]).ships == behaviour_for("sequence").ships == wire.INSERT
    # AlphaZero's evaluates leaves and MuZero's answers queries; their actors ship the games
    # ('search' names two behaviours now: the loop above expects it to ask for the algorithm)
    assert behaviour_for(CONFIGS["alphazero"]).ships == ""
    with pytest.raises(ValueError, match="no behaviour for a 'transitions' algorithm"):
        behaviour_for(CONFIGS["dqn"], "param_server")
