"""The learner's parts (``docs``: "the spine"): a data source (``sources``: where
training batches come from), an updater (``updaters``: what training on one does to the
parameters) and the checks of what a learner is handed (``checks``). The learner node
(``nodes/learner.py``) is the shell that picks one of each from the configuration."""
