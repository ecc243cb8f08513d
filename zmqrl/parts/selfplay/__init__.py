"""Self-play for two-player zero-sum games: the topology's ``self_play`` section
(:mod:`zmqrl.parts.selfplay.config`), the opponent pool the acting side samples opponents from
(:mod:`zmqrl.parts.selfplay.pool`), and the ratings the league node keeps
(:mod:`zmqrl.parts.selfplay.elo`) and its checkpoint
(:mod:`zmqrl.parts.selfplay.league_state`). The behaviour that plays is
``zmqrl.parts.acting.self_play``.

Importing this package loads no torch.
"""
