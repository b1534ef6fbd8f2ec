"""The counter race: N writers increment the same rows at once, with one of five strategies."""

from occviz.scenarios.counter.scenario import scenario

__all__ = ["scenario"]
