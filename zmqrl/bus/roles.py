"""What the run counts a node for: the ``role`` a node says in its ``hello``.

The supervisor (:mod:`zmqrl.run.runmetrics`) pools the nodes' reports by role, never by a
node's ``kind``: a subclass of a built-in node under ``impl:`` inherits its role, and a
``command:`` node (any language) says its own. A node with no role is not counted.

Each role says what the ``env_steps`` of the node's metrics rows mean:
"""

from __future__ import annotations

ACTS = "acts"  # env steps it took itself (an actor): counted once, however it acts
SERVES = "serves"  # env steps of the connections it acted for (an inference broker)
# env steps of the experience it trained on, restored with its checkpoint (a learner);
# its row is the run's learner row (updates)
LEARNS = "learns"
APPLIES = "applies"  # env steps behind the gradients it applied (a parameter server)
NONE = ""

ROLES = (ACTS, SERVES, LEARNS, APPLIES, NONE)

# How a field a node ``shows`` (its hello) is pooled over the nodes that show it, for the
# progress line: added up (games, simulations/s) or the latest report's (a win rate).
POOLING = ("sum", "last")
MAX_SHOWN = 8  # fields one node may show
