"""The contention curve: the counter race over 1, 2, 4, ... 64 writers for chosen strategies, beside pgbench."""

from occviz.scenarios.sweep.scenario import scenario

__all__ = ["scenario"]
