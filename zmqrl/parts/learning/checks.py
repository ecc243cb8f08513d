"""What a learner checks in what it is handed, before it stores, credits or trains on
it: unrolls on its ``experience`` port, ``batch`` replies from a replay and ``params``
replies from a parameter server, each against its declaration in ``zmqrl.bus.messages``.

Every violation raises :class:`wire.ProtocolError` (one log line and, on a ROUTER port,
an ``error`` reply): a producer that talks to the learner directly (IMPALA's local-policy
actors bypass the broker's checks) or a replay that stored something bad must not crash
it, and one NaN trained on would poison every parameter the learner then publishes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from zmqrl.bus import messages, wire
from zmqrl.parts.envs import EnvSpec

UNROLL_KEYS = ("obs", "action", "logp", "reward", "done")
STATE_KEYS = ("state_h", "state_c")  # unrolls of a recurrent policy (lstm_ac)


def item_keys(items: str, sent: Mapping[str, bool] | None = None) -> tuple[str, ...]:
    """What a learner trains on of replay item kind ``items``: the arrays its ``batch``
    variant requires besides the batch's own head (``key``, ``weight``), and the optional
    ones the run's configuration sends (``sent``: ``Context.arrays``, e.g. MuZero's
    ``obs_unroll`` for its consistency loss). Read from the declaration (the core's or a
    plug-in's MessageSet), so a new item kind needs no table here."""
    head = {a.name for a in messages.BATCH_HEAD}
    sent = sent or {}
    return tuple(a.name for a in messages.spec(wire.BATCH, items).arrays
                 if (a.required or sent.get(a.name) is True) and a.name not in head)


def context(env: EnvSpec, model: torch.nn.Module, *, unroll: int | None = None,
            sequence_length: int | None = None, state_size: int = 0,
            algo: Any = None) -> messages.Context:
    """The dimensions a learner knows: the env's spaces, the unroll length T or the
    sequence length L, the recurrent state size H (0: none in the data), the model's
    tensors (what ``params`` replies must carry) and what the algorithm's config fixes
    (``AlgoConfig.message_dims``, ``optional_arrays``)."""
    return messages.Context.from_env(env, unroll=unroll, sequence_length=sequence_length,
                                     state_size=state_size, model=model, algo=algo)


def check_unroll(msg: wire.Message, ctx: messages.Context, recurrent: bool) -> int:
    """An ``unroll`` the learner can queue and train on; returns its env columns n."""
    spec = messages.spec(wire.UNROLL, "recurrent" if recurrent else "")
    return messages.check(msg, spec, ctx)["n"]


def check_batch(msg: wire.Message, ctx: messages.Context, items: str) -> int:
    """A replay's ``batch`` reply of ``items`` (transitions, sequences with their stored
    recurrent state, or positions) the learner can train on; returns its size B."""
    return messages.check(msg, messages.spec(wire.BATCH, items), ctx)["B"]


def check_params(msg: wire.Message, ctx: messages.Context) -> int:
    """A ``params`` reply: exactly the model's tensors, finite; returns its version."""
    messages.check(msg, messages.spec(wire.PARAMS), ctx)
    version: Any = msg.fields["version"]
    return version
