"""R2D2 (Kapturowski et al. 2019) as parts, laid out as a plug-in is:

* ``config``: the ``r2d2`` algorithm (torch-free);
* ``models``: ``lstm_q``, ``nature_cnn_lstm_q``, ``impala_cnn_lstm_q`` (DQN's dueling head
  after the shared LSTM core);
* ``acting``: the ``recurrent_q`` behaviour (ε-greedy on a carried LSTM state; its
  sequences are cut by ``zmqrl.parts.sequences``);
* ``learner``: burn-in, n-step double-Q targets under the value rescaling, sequence
  priorities.

Importing this package loads no torch.
"""
