"""MuZero (Schrittwieser et al. 2020) as parts: search in a learned model, the model,
its learner, its acting through the inference broker and its self-play."""
