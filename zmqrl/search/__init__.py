"""Search-based acting (AlphaZero): batched MCTS over many games (:mod:`zmqrl.search.mcts`)
and perfect players to measure it against (:mod:`zmqrl.search.minimax`)."""
