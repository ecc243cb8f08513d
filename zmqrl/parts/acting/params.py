"""Following a publisher's parameters: what the inference broker and local actors load.

A ``params`` message carries the learner's (or parameter server's) state dict, its
``version`` (update count) and ``source`` (the publisher's incarnation). The follower
loads a newer version, or an older one from another source (a publisher restarted
from a checkpoint behind what we hold: its line is the one that continues; see
``zmqrl.parts.models.wants_params``), and rejects parameters that do not fit the model with a
logged error, acting on with what it has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zmqrl.bus import wire

if TYPE_CHECKING:  # annotations only: importing this module must not load torch
    import torch


class ParamsFollower:
    """``node`` is the node that follows: rejections are logged on its log and counted
    in its ``bad_messages``, like any other message it rejects."""

    def __init__(self, model: torch.nn.Module, node: Any):
        self.model = model
        self.node = node
        self.version = 0
        self.source: Any = None  # incarnation of the publisher of our parameters

    def _reject(self, text: str, *args: Any) -> bool:
        self.node.bad_messages += 1
        self.node.log.error(text, *args)
        return False

    def offer(self, msg: wire.Message) -> bool:
        """Load ``msg`` if it is wanted; True if the model changed."""
        from zmqrl.parts.models import load_state_arrays, wants_params  # loaded with our model

        version, source = msg.fields.get("version"), msg.fields.get("source")
        if type(version) is not int:
            return self._reject("rejected params: version %r is not an integer", version)
        if not wants_params(version, source, self.version, self.source):
            return False
        try:
            load_state_arrays(self.model, msg.arrays)
        except (RuntimeError, KeyError, ValueError) as exc:  # keep acting with what we have
            return self._reject("rejected params version %d: %s", version, exc)
        self.version, self.source = version, source
        return True
