"""Search-based acting (AlphaZero): batched MCTS over many games (:mod:`zmqrl.parts.search.mcts`)
and perfect players to measure it against (:mod:`zmqrl.parts.search.minimax`)."""
