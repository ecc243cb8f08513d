"""The batch a learner's ``update(batch)`` receives, one table per item kind, generated
from the message declarations (``zmqrl.bus.messages``, the core's and the plug-ins'), so
docs/extending.md cannot drift from what a learner is handed.

A batch is a dict of torch tensors on the learner's device. From unrolls (the learner's
``experience`` port): the unroll's arrays, time-major, ``n`` the batch's env columns.
From a replay: the arrays of its ``batch`` variant, batch-major, with the importance
weights as ``weight`` (the wire's name) and without ``key`` (the source sends the
priorities back by key itself); optional arrays come exactly when the run's
configuration sends them (``AlgoConfig.optional_arrays``).

    python -m zmqrl.parts.learning.batch_doc                             # print
    python -m zmqrl.parts.learning.batch_doc --write docs/extending.md   # update
"""

from __future__ import annotations

import sys

from zmqrl.bus import messages, wire
from zmqrl.parts.learning.checks import STATE_KEYS, UNROLL_KEYS

BEGIN, END = "<!-- batch:begin -->", "<!-- batch:end -->"


def _row(a: messages.Array, when: str) -> str:
    shape = "`[" + ", ".join(str(p) for p in a.shape) + "]`"
    return f"| `{a.name}` | {a.dtype} | {shape} | {when} | {a.doc} |"


def markdown() -> str:
    head = ["| Key | dtype | Shape | When | Meaning |", "|---|---|---|---|---|"]
    out = []
    for variant, recurrent in (("", False), ("recurrent", True)):
        spec = messages.spec(wire.UNROLL, variant)
        keys = UNROLL_KEYS + (STATE_KEYS if recurrent else ())
        title = "unrolls" + (" of a recurrent policy (`lstm_ac`)" if recurrent else "")
        out += [f"**{title}** (the learner's `experience` port; time-major)", "", *head]
        out += [_row(a, "always") for a in spec.arrays if a.name in keys]
        out.append("")
    skip = {a.name for a in messages.BATCH_HEAD} - {"weight"}
    for spec in messages.registered(every=True).values():
        if spec.type != wire.BATCH:
            continue
        out += [f"**{spec.variant}** (a replay's `batch` {spec.variant}; batch-major)", "",
                *head]
        out += [_row(a, "always" if a.required else "when the configuration sends it")
                for a in spec.arrays if a.name not in skip]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    from zmqrl.parts.learning import batch_doc as _module  # (see zmqrl.bus.messages)

    if sys.argv[1:2] == ["--write"]:
        messages.replace_between(sys.argv[2], BEGIN, END, _module.markdown())
    else:
        sys.stdout.write(_module.markdown())
