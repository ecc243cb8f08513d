"""DQN as parts, laid out as a plug-in is (``examples/plugins/boltzmann``): Ape-X DQN and
Gorila are DQN's parts in different topologies.

* ``config``: the ``dqn`` algorithm (torch-free, as every config);
* ``models``: ``dueling_mlp``, ``dueling_nature_cnn``, ``dueling_impala_cnn``;
* ``acting``: the ``epsilon_greedy`` behaviour (Ape-X's per-actor ε), with n-step
  transitions and initial priorities;
* ``learner``: double DQN with n-step targets and importance weights, on the shared
  target-network base (``zmqrl.parts.algos.target_q``).

Importing this package loads no torch.
"""
