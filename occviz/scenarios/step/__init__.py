"""Step mode: transactions on real connections, stepped one statement at a time by a teacher or in written order."""

from occviz.scenarios.step.scenario import scenario

__all__ = ["scenario"]
