"""Running a topology: loading and checking it (every part resolved and held to its
contract), the supervisor and launcher, restarts, run metrics, the progress line,
plots, the bench, PBT's expansion of a population, and the Ray engine.

The top layer, built on the bus and the parts.
"""
