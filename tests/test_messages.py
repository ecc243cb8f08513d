"""zmqrl.bus.messages: every declared rule accepts a good message and rejects a bad one with
a clear error, and docs/protocol.md holds exactly the generated tables."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zmqrl.bus import messages, wire
from zmqrl.parts.envs import env_spec

DOC = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"
BEGIN, END = "<!-- messages:begin -->", "<!-- messages:end -->"
CARTPOLE = env_spec({"id": "CartPole-v1"})
PENDULUM = env_spec({"id": "Pendulum-v1"})  # Box actions, shape [1]
T, L, H = 4, 3, 8


def ctx(env=CARTPOLE, **kw) -> messages.Context:
    return messages.Context.from_env(env, unroll=T, sequence_length=L, state_size=H, **kw)


def msg(msg_type: str, arrays: dict, **fields) -> wire.Message:
    """As a receiver sees it: encoded and decoded."""
    return wire.decode(wire.encode(msg_type, arrays, **fields))


def check(m: wire.Message, key: str, context: messages.Context | None = None) -> dict:
    return messages.check(m, messages.SPECS[key], context or ctx())


def step(n: int = 3, **over) -> dict:
    a = {"obs": np.zeros((n, 4), np.float32), "reward": np.zeros(n, np.float32),
         "done": np.zeros(n, bool)}
    a.update(over)
    return {k: v for k, v in a.items() if v is not None}


def unroll(n: int = 2, **over) -> dict:
    a = {"obs": np.zeros((T + 1, n, 4), np.float32), "action": np.ones((T, n), np.int64),
         "logp": np.zeros((T, n), np.float32), "reward": np.zeros((T, n), np.float32),
         "done": np.zeros((T, n), bool)}
    a.update(over)
    return {k: v for k, v in a.items() if v is not None}


def transitions(b: int = 5, **over) -> dict:
    a = {"obs": np.zeros((b, 4), np.float32), "action": np.zeros(b, np.int64),
         "reward": np.ones(b, np.float32), "discount": np.full(b, 0.97, np.float32),
         "next_obs": np.zeros((b, 4), np.float32), "priority": np.ones(b, np.float32)}
    a.update(over)
    return {k: v for k, v in a.items() if v is not None}


def sequences(b: int = 2, **over) -> dict:
    a = {"obs": np.zeros((b, L + 1, 4), np.float32), "action": np.zeros((b, L), np.int64),
         "reward": np.zeros((b, L), np.float32), "done": np.zeros((b, L), bool),
         "state_h": np.zeros((b, H), np.float32), "state_c": np.zeros((b, H), np.float32)}
    a.update(over)
    return {k: v for k, v in a.items() if v is not None}


# ----- good messages pass, with their dimensions -----------------------------------
def test_good_messages_pass_and_bind_their_dimensions():
    assert check(msg("step", step(3), seq=1), "step") == {"T": T, "L": L, "H": H, "n": 3}
    full = step(3, done=np.array([1, 1, 0], bool), truncated=np.array([0, 1, 0], bool),
                final_obs=np.ones((1, 4), np.float32), ep_return=np.ones(2, np.float32),
                ep_length=np.ones(2, np.int32))
    dims = check(msg("step", full, seq=2, epsilon=0.25), "step")
    assert (dims["n"], dims["m"], dims["k"]) == (3, 1, 2)
    assert check(msg("act", {"action": np.array([0, 1])}, seq=2), "act")["n"] == 2
    assert check(msg("unroll", unroll(2), version=3), "unroll")["n"] == 2
    rec = unroll(2, state_h=np.zeros((1, 2, H), np.float32),
                 state_c=np.zeros((1, 2, H), np.float32))
    check(msg("unroll", rec, version=0), "unroll/recurrent")
    assert check(msg("insert", transitions(5), version=1), "insert/transitions")["B"] == 5
    assert check(msg("insert", sequences(2)), "insert/sequences")["B"] == 2
    head = {"key": np.arange(2), "weight": np.ones(2, np.float32)}
    check(msg("batch", {**head, **sequences(2)}), "batch/sequences")
    check(msg("sample", {}, batch_size=32), "sample")
    check(msg("priorities", {"key": np.arange(3), "priority": np.ones(3, np.float32)}),
          "priorities")
    check(msg("credit", {}, n=1), "credit")
    check(msg("hello", {}, label="a.1", kind="actor", node="a", replica=1,
              incarnation="ab12", pid=42), "hello")
    check(msg("metrics", {}, label="a", row={"time_s": 1.5, "loss": float("nan"),
                                            "digest": "ab"}, episodes=[1.0, 2]), "metrics")
    check(msg("ping", {}), "ping")
    check(msg("error", {}, error="why"), "error")


def test_unknown_dimensions_bind_freely():
    free = messages.Context()
    dims = check(msg("insert", transitions(5, obs=np.zeros((5, 2, 3), np.float32),
                                           next_obs=np.zeros((5, 2, 3), np.float32))),
                 "insert/transitions", free)
    assert dims["B"] == 5 and dims["*obs"] == (2, 3)
    with pytest.raises(wire.ProtocolError, match=re.escape("'next_obs' of shape [5, 2, 3]")):
        check(msg("insert", transitions(5, obs=np.zeros((5, 2, 3), np.float32))),
              "insert/transitions", free)


def test_box_actions_are_finite_floats_outside_the_bounds_too():
    box = messages.Context.from_env(PENDULUM, unroll=T)
    # bounds are [-2, 2]; Pendulum's observation has 3 entries
    a = unroll(2, obs=np.zeros((T + 1, 2, 3), np.float32),
               action=np.full((T, 2, 1), 7.0, np.float32))
    check(msg("unroll", a, version=0), "unroll", box)
    a["action"][0, 0, 0] = np.nan
    with pytest.raises(wire.ProtocolError, match="'action' must be inside the action space"):
        check(msg("unroll", a, version=0), "unroll", box)
    with pytest.raises(wire.ProtocolError, match=re.escape("'action' must be float32, got int64")):
        check(msg("unroll", {**a, "action": np.zeros((T, 2, 1), np.int64)}, version=0),
              "unroll", box)


# ----- each rule rejects, and says what and where ----------------------------------
REJECTED = {
    "float64 reward": ("step", step(reward=np.zeros(3)), {"seq": 1},
                       "step 'reward' must be float32, got float64"),
    "uint8 done": ("step", step(done=np.zeros(3, np.uint8)), {"seq": 1},
                   "step 'done' must be bool, got uint8"),
    "string seq": ("step", step(), {"seq": "7"}, "step field 'seq' must be int, got '7'"),
    "bool seq": ("step", step(), {"seq": True}, "step field 'seq' must be int, got True"),
    "missing seq": ("step", step(), {}, "step needs field 'seq' (int)"),
    "epsilon above 1": ("step", step(), {"seq": 1, "epsilon": 1.5},
                        "step field 'epsilon' must be in [0, 1], got 1.5"),
    "wrong obs shape": ("step", step(obs=np.zeros((2, 7), np.float32)), {"seq": 1},
                        "step needs 'obs' of shape [n, 4], got (2, 7)"),
    "no envs": ("step", step(0), {"seq": 1}, "step needs 'obs' of shape [n, 4] with n >= 1"),
    "reward for other envs": ("step", step(reward=np.zeros(2, np.float32)), {"seq": 1},
                              "step needs 'reward' of shape [3], got (2,)"),
    "missing reward": ("step", step(reward=None), {"seq": 1},
                       "step needs 'reward' of shape [3] (float32), got none"),
    "NaN obs": ("step", step(obs=np.full((3, 4), np.nan, np.float32)), {"seq": 1},
                "step 'obs' must be finite (no NaN or inf)"),
    "inf reward": ("step", step(reward=np.full(3, np.inf, np.float32)), {"seq": 1},
                   "step 'reward' must be finite"),
    "2-D ep_return": ("step", step(ep_return=np.zeros((2, 1), np.float32),
                                   ep_length=np.zeros(2, np.int32)), {"seq": 1},
                      "step needs 'ep_return' of shape [k], got (2, 1)"),
    "ep_length of another length": ("step", step(ep_return=np.zeros(2, np.float32),
                                                 ep_length=np.zeros(3, np.int32)), {"seq": 1},
                                    "step needs 'ep_length' of shape [2], got (3,)"),
    "ep_return alone": ("step", step(ep_return=np.zeros(2, np.float32)), {"seq": 1},
                        "'ep_return' and 'ep_length' must come together"),
    "int64 ep_length": ("step", step(ep_return=np.zeros(1, np.float32),
                                     ep_length=np.zeros(1, np.int64)), {"seq": 1},
                        "step 'ep_length' must be int32, got int64"),
    "truncated without done": ("step", step(truncated=np.array([0, 1, 0], bool),
                                            final_obs=np.zeros((1, 4), np.float32)),
                               {"seq": 1}, "step 'truncated' implies 'done': entry 1"),
    "final_obs rows": ("step", step(done=np.ones(3, bool), truncated=np.array([1, 1, 0], bool),
                                    final_obs=np.zeros((1, 4), np.float32)), {"seq": 1},
                       "'final_obs' needs one row per true entry of 'truncated' (2), got 1"),
    "final_obs alone": ("step", step(final_obs=np.zeros((0, 4), np.float32)), {"seq": 1},
                        "'truncated' and 'final_obs' must come together"),
    "action out of range": ("unroll", unroll(action=np.full((T, 2), 2, np.int64)),
                            {"version": 0}, "unroll 'action' must be inside the action space"),
    "negative action": ("unroll", unroll(action=np.full((T, 2), -1, np.int64)),
                        {"version": 0}, "unroll 'action' must be inside the action space"),
    "int32 action": ("unroll", unroll(action=np.zeros((T, 2), np.int32)), {"version": 0},
                     "unroll 'action' must be int64, got int32"),
    "unroll of another length": ("unroll", unroll(obs=np.zeros((T, 2, 4), np.float32)),
                                 {"version": 0}, f"unroll needs 'obs' of shape [{T + 1}, n, 4]"),
    "non-int version": ("unroll", unroll(), {"version": 1.0},
                        "unroll field 'version' must be int, got 1.0"),
    "negative version": ("unroll", unroll(), {"version": -1},
                         "unroll field 'version' must be finite and >= 0, got -1"),
    "NaN logp": ("unroll", unroll(logp=np.full((T, 2), np.nan, np.float32)), {"version": 0},
                 "unroll 'logp' must be finite"),
    "discount 1.5": ("insert", transitions(discount=np.full(5, 1.5, np.float32)), {},
                     "insert 'discount' must be in [0, 1]"),
    "negative priority": ("insert", transitions(priority=np.full(5, -1, np.float32)), {},
                          "insert 'priority' must be finite and >= 0"),
    "extra item field": ("insert", transitions(extra=np.zeros(5, np.float32)), {},
                         "insert has unexpected array 'extra'"),
    "sample of 0": ("sample", {}, {"batch_size": 0},
                    "sample field 'batch_size' must be >= 1, got 0"),
    "credit as str": ("credit", {}, {"n": "1"}, "credit field 'n' must be int, got '1'"),
    "priorities of two lengths": ("priorities", {"key": np.arange(3),
                                                 "priority": np.ones(2, np.float32)}, {},
                                  "priorities needs 'priority' of shape [3], got (2,)"),
    "hello with a str replica": ("hello", {}, {"label": "a", "kind": "actor", "node": "a",
                                              "replica": "0", "incarnation": "x", "pid": 1},
                                 "hello field 'replica' must be int, got '0'"),
    "metrics row of lists": ("metrics", {}, {"label": "a", "row": {"x": [1]}, "episodes": []},
                             "metrics field 'row' must be a map from str"),
    "metrics NaN return": ("metrics", {}, {"label": "a", "row": {},
                                           "episodes": [float("nan")]},
                           "metrics field 'episodes' must be a list of finite numbers"),
    "metrics without label": ("metrics", {}, {"row": {}, "episodes": []},
                              "metrics needs field 'label' (str)"),
}


@pytest.mark.parametrize("msg_type,arrays,fields,reason", REJECTED.values(), ids=REJECTED.keys())
def test_each_rule_rejects_with_a_clear_error(msg_type, arrays, fields, reason):
    key = {"insert": "insert/transitions"}.get(msg_type, msg_type)
    with pytest.raises(wire.ProtocolError, match=re.escape(reason)):
        check(msg(msg_type, arrays, **fields), key)


def test_sequences_check_their_length_and_state_size():
    with pytest.raises(wire.ProtocolError, match=re.escape(f"'obs' of shape [B, {L + 1}, 4]")):
        check(msg("insert", sequences(obs=np.zeros((2, L, 4), np.float32))), "insert/sequences")
    with pytest.raises(wire.ProtocolError, match=re.escape(f"'state_c' of shape [2, {H}]")):
        check(msg("insert", sequences(state_c=np.zeros((2, H + 1), np.float32))),
              "insert/sequences")
    with pytest.raises(wire.ProtocolError, match="needs 'state_h'"):
        check(msg("unroll", unroll(), version=0), "unroll/recurrent")


def test_model_tensors_are_exactly_the_models():
    from zmqrl.parts.models import build_model, state_arrays

    model = build_model({"kind": "mlp", "hidden": [8]}, CARTPOLE)
    context = ctx(model=model)
    grads = {k: np.zeros(p.shape, np.float32) for k, p in model.named_parameters()}
    check(msg("grads", grads, env_steps=4), "grads", context)
    check(msg("params", state_arrays(model), version=0), "params", context)
    name = next(iter(grads))
    with pytest.raises(wire.ProtocolError, match=f"missing '{re.escape(name)}'"):
        check(msg("grads", {k: v for k, v in grads.items() if k != name}), "grads", context)
    with pytest.raises(wire.ProtocolError, match="unexpected 'bogus'"):
        check(msg("grads", {**grads, "bogus": np.zeros(1, np.float32)}), "grads", context)
    with pytest.raises(wire.ProtocolError, match=f"'{re.escape(name)}' must be finite"):
        check(msg("grads", {**grads, name: np.full_like(grads[name], np.inf)}), "grads",
              context)
    with pytest.raises(wire.ProtocolError, match=f"needs '{re.escape(name)}' of shape"):
        check(msg("grads", {**grads, name: np.zeros(3, np.float32)}), "grads", context)
    with pytest.raises(wire.ProtocolError, match="must be float16 or float32 or float64"):
        check(msg("grads", {**grads, name: grads[name].astype(np.int32)}), "grads", context)


def test_a_message_of_another_type_is_rejected():
    with pytest.raises(wire.ProtocolError, match="expected 'step', got 'unroll'"):
        check(msg("unroll", unroll(), version=0), "step")


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 8), data=st.data())
def test_steps_the_actor_could_send_pass_and_any_nan_fails(n, data):
    """Any terminated/truncated pattern an env can produce, as the actor encodes it."""
    terminated = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    cut = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    truncated = cut & ~terminated  # both at once: sent as terminated
    arrays = step(n, done=terminated | cut, truncated=truncated,
                  final_obs=np.zeros((int(truncated.sum()), 4), np.float32),
                  reward=np.array(data.draw(st.lists(
                      st.floats(-1e6, 1e6, width=32), min_size=n, max_size=n)), np.float32))
    assert check(msg("step", arrays, seq=1), "step")["n"] == n
    i = data.draw(st.integers(0, n - 1))
    arrays["reward"][i] = np.nan
    with pytest.raises(wire.ProtocolError, match="'reward' must be finite"):
        check(msg("step", arrays, seq=1), "step")


# ----- the protocol document ---------------------------------------------------------
def test_protocol_doc_holds_the_generated_tables():
    text = DOC.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1, f"{DOC} lacks the markers"
    block = text.split(BEGIN)[1].split(END)[0].strip("\n") + "\n"
    assert block == messages.markdown(), (
        "docs/protocol.md's message tables differ from zmqrl/bus/messages.py: regenerate them "
        "with `python -m zmqrl.bus.messages --write docs/protocol.md` (it replaces what stands "
        f"between the markers {BEGIN} and {END})")


def test_the_module_prints_the_tables():
    out = subprocess.run([sys.executable, "-m", "zmqrl.bus.messages"], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    assert out == messages.markdown()
    for spec in messages.MESSAGES:
        assert f"#### `{spec.type}`" in out


@pytest.fixture
def declared(monkeypatch):
    """Install MessageSets as if plug-ins registered them in ``zmqrl.messages``."""
    import dataclasses

    from zmqrl import plugins

    sets: dict[str, messages.MessageSet] = {}
    real_names, real_resolve = plugins.names, plugins.resolve
    monkeypatch.setattr(plugins, "names", lambda part: sorted(sets) if part == "messages"
                        else real_names(part))
    monkeypatch.setattr(plugins, "resolve", lambda part, name, *a: sets[name]
                        if part == "messages" else real_resolve(part, name, *a))
    monkeypatch.setattr(messages, "SYMBOLS", dict(messages.SYMBOLS))
    monkeypatch.setattr(messages, "_IN_USE", None)  # (as if no topology were loaded yet)
    messages.registered.cache_clear()
    yield sets, dataclasses.replace
    messages.registered.cache_clear()


def test_a_plugin_declares_its_own_item_kind_and_symbols(declared):
    sets, _ = declared
    marbles = messages.MessageSpec(
        wire.INSERT, "marbles", variant="marbles", closed=True,
        arrays=(messages.Array("obs", "obs", ("B", "*obs")),
                messages.Array("colour", "int8", ("B", "Q"))))
    sets["marbles"] = messages.MessageSet((marbles,), symbols={"Q": ("colours", 1)})
    assert messages.spec(wire.INSERT, "marbles") is marbles
    assert "`Q` colours (≥ 1)" in messages.markdown() and "marbles" in messages.markdown()
    ctx = messages.Context.from_env(env_spec({"id": "CartPole-v1"}))
    good = wire.decode(wire.encode(wire.INSERT, {"obs": np.zeros((2, 4), np.float32),
                                                 "colour": np.zeros((2, 3), np.int8)}))
    assert messages.check(good, marbles, ctx)["Q"] == 3
    with pytest.raises(KeyError, match="variants of 'insert': marbles, positions, "):
        messages.spec(wire.INSERT, "pebbles")


@pytest.mark.parametrize("clash, error", [
    ("key", "'insert/transitions' is declared twice"),
    ("symbol", "shape symbol 'B' is already declared"),
    ("type", "'teleport' is not a wire message type"),
])
def test_a_plugin_cannot_redeclare_what_exists(declared, clash, error):
    from zmqrl import plugins

    sets, replace = declared
    ours = messages.SPECS["insert/transitions"]  # (spec() would load the sets now)
    if clash == "key":
        sets["bad"] = messages.MessageSet((replace(ours, doc="mine now"),))
    elif clash == "symbol":
        sets["bad"] = messages.MessageSet((), symbols={"B": ("bricks", 1)})
    else:
        sets["bad"] = messages.MessageSet((replace(ours, type="teleport"),))
    # (the core's own lookups load no set: registered() is what loads them all)
    with pytest.raises(plugins.PluginError, match=f"messages 'bad': {re.escape(error)}"):
        messages.registered(every=True)


def test_a_set_s_symbols_are_its_own_and_a_topology_loads_only_the_sets_it_names(
        declared, monkeypatch):
    """Issue 43 §2.4: every process loaded every installed set and their symbols shared
    one namespace, so a plug-in that also named a symbol ``K`` (MuZero's), or whose set
    failed to import, broke every topology on the machine."""
    from zmqrl import plugins
    from zmqrl.run.topology import from_dict

    sets, _ = declared

    def kind(variant: str) -> messages.MessageSpec:
        return messages.MessageSpec(
            wire.INSERT, variant, variant=variant, closed=True,
            arrays=(messages.Array("obs", "obs", ("B", "*obs")),
                    messages.Array("lap", "float32", ("B", "K"))))

    laps, legs = kind("laps"), kind("legs")
    sets["laps"] = messages.MessageSet((laps,), symbols={"K": ("laps per race", 3)})
    sets["legs"] = messages.MessageSet((legs,), symbols={"K": ("legs per relay", 1)})
    sets["broken"] = messages.MessageSet(())
    resolve = plugins.resolve

    def failing(part: str, name: str, *a):
        if part == "messages" and name == "broken":
            raise plugins.PluginError("messages 'broken': cannot import relay_plugin")
        return resolve(part, name, *a)

    monkeypatch.setattr(plugins, "resolve", failing)
    # A topology whose algorithm names no set validates, and its ports resolve their
    # messages, with the broken set installed (before: every lookup imported it).
    raw = {"name": "t", "env": {"id": "CartPole-v1"},
           "model": {"kind": "dueling_mlp", "hidden": [8]},
           "algo": {"kind": "dqn", "batch_size": 8},
           "nodes": {"replay": {"kind": "replay"}}}
    assert from_dict(raw, "t.yaml").nodes["replay"].kind == "replay"
    assert messages.spec(wire.INSERT, "transitions").variant == "transitions"
    # Both sets' K, each checked with its own least value (before: "already declared").
    messages.use(["laps", "legs"])
    ctx = messages.Context.from_env(env_spec({"id": "CartPole-v1"}))

    def insert(k: int) -> wire.Message:
        return wire.decode(wire.encode(wire.INSERT, {"obs": np.zeros((2, 4), np.float32),
                                                     "lap": np.zeros((2, k), np.float32)}))

    assert messages.check(insert(2), messages.spec(wire.INSERT, "legs"), ctx)["K"] == 2
    with pytest.raises(wire.ProtocolError, match="with K >= 3"):
        messages.check(insert(2), messages.spec(wire.INSERT, "laps"), ctx)
    assert messages.check(insert(3), messages.spec(wire.INSERT, "laps"), ctx)["K"] == 3
    # The broken set hurts only a lookup no named set answers, and says why.
    with pytest.raises(plugins.PluginError, match="cannot import relay_plugin"):
        messages.spec(wire.INSERT, "pebbles")
