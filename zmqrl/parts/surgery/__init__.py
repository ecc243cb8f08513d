"""Surgery: carry what a run has learned into a changed model (issue 45).

A surgery is a part (``parts: {surgery: NAME}``, the ``zmqrl.surgery`` entry points or
an import path): an object with the :class:`Surgery` methods. The built-in one,
``net2net`` (:mod:`.net2net`), holds the function-preserving transforms (wider, deeper,
new input features, new actions) over the chains of Linear layers a model declares
(``surgery_chains()``); a model it cannot carry is refused naming the layer. A model
those chains cannot describe (convolutions, an LSTM) gets a surgery part of its own.
:mod:`.moments` carries the optimizer's moments after whatever the part placed.

Importing this package loads no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Surgery(Protocol):
    """How a trained model is carried into a changed one (``zmqrl.run.surgery``)."""

    @staticmethod
    def carry(old: Any, new: Any, inputs: Sequence[int] | None = None,
              logit_tolerance: float = 1e-4) -> Any:
        """Write ``old``'s parameters into ``new`` (in place) so that ``new`` computes
        what ``old`` did; raise ``net2net.SurgeryRefused`` naming the layer, before
        writing anything, where it cannot. Returns a report with ``lines()`` and
        ``placed`` (new parameter -> (old parameter, index) where the old values sit
        unchanged: what the optimizer's moments follow; ``{}`` carries none)."""
        ...

    @staticmethod
    def check(old: Any, new: Any, obs: Any, inputs: Sequence[int] | None = None
              ) -> dict[str, float]:
        """The largest absolute difference of each output, ``new`` against ``old``, on
        the new model's observations ``obs``."""
        ...
