"""The actor-critic algorithms as parts, laid out as a plug-in is: IMPALA's V-trace, A2C
and A3C, and PPO share their networks and their behaviour.

* ``config``: the ``vtrace``, ``a2c`` and ``ppo`` algorithms (torch-free);
* ``models``: ``mlp``, ``lstm_ac``, ``nature_cnn``, ``impala_cnn`` and their ``_lstm``
  kinds;
* ``acting``: the ``actor_critic`` behaviour (unrolls of the current policy), and
  ``a3c``: the ``a3c_gradients`` behaviour (actors that ship gradients);
* ``learner``: what the learners share; ``vtrace``, ``a2c``, ``ppo`` and
  ``recurrent_ppo``: the learners.

Importing this package loads no torch.
"""
