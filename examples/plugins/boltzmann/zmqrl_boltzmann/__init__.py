"""A zmqrl plug-in: expected-SARSA Q-learning with Boltzmann (softmax) exploration.

Four parts, each in its own module and registered by entry point (pyproject.toml):

* ``config``: the algorithm's hyperparameters and the parts it is made of (torch-free);
* ``behaviour``: actors sample actions from softmax(Q / temperature) and ship n-step
  transitions (the built-in replay stores them);
* ``model``: a plain MLP Q-network;
* ``learner``: expected-SARSA targets under the same softmax policy, against a target
  network.
"""
