"""Surgery: carry what a run has learned into a changed model (issue 45).

:mod:`.net2net` holds the function-preserving transforms (wider, deeper, new input
features, new actions) over the chains of Linear layers a model declares
(``surgery_chains()``); a model it cannot carry is refused naming the layer.

Importing this package loads no torch.
"""
