"""AlphaZero (Silver et al. 2018) as parts, laid out as a plug-in is:

* ``config``: the ``alphazero`` algorithm (torch-free), the search's knobs included;
* ``models``: ``pv_mlp`` and ``pv_conv``, policy-value networks;
* ``learner``: the policy cross-entropy and value regression.

Acting is search: the ``mcts_actor`` node with the shared MCTS (``zmqrl.parts.search``),
its leaves evaluated by the inference broker's ``evaluate`` behaviour.

Importing this package loads no torch.
"""
