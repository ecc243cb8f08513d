"""What architectures are made of, each registered by name as a plug-in's parts are
(``zmqrl.plugins``): acting (behaviours and the batching core), learning (data sources,
updaters), algos (configs, losses, learners), models, replay, search, self-play, envs
and games.

Built on the bus; imports nothing from ``zmqrl.run``.
"""
