"""Self-play for two-player zero-sum games: the topology's ``self_play`` section
(:mod:`zmqrl.parts.selfplay.config`), the opponent pool the acting side samples opponents from
(:mod:`zmqrl.parts.selfplay.pool`), and the ratings the league node keeps
(:mod:`zmqrl.parts.selfplay.elo`) and its checkpoint
(:mod:`zmqrl.parts.selfplay.league_state`). The behaviours that play are
``zmqrl.parts.selfplay.acting`` (one learner against its pool) and
``zmqrl.parts.selfplay.population_acting`` (a population's members against each other);
``zmqrl.parts.selfplay.models`` holds the board actor-critic (``board_mlp``).

Importing this package loads no torch.
"""
