"""Off-policy continuous control: Ape-X DPG's shape with TD3 and SAC learners.

Many actors explore around a policy (Gaussian noise around a deterministic one, each
actor its own scale, as Ape-X gives each actor its own ε; or a squashed Gaussian's own
samples for SAC), cut n-step transitions with initial priorities from the acting
critic, and feed a prioritized replay; one learner (TD3 or SAC, twin critics, importance
weights) samples it and sends new priorities back. The same behaviours act in a local
actor and, per connection, inside the inference broker (SEED's shape).

The parts are registered exactly as a plug-in's are (pyproject.toml's entry points):

* ``config``: the algorithms ``td3`` and ``sac`` (torch-free, as every config);
* ``models``: ``td3_mlp`` and ``sac_mlp``, a policy and twin Q-networks;
* ``acting``: the behaviours ``gaussian_noise`` and ``squashed_gaussian``;
* ``twin_q``, ``td3``, ``sac``: the learners and the targets they share with acting.

Importing this package loads no torch.
"""
