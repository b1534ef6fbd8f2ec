"""The controller race: controllers A and B (up to H) reconcile one Deployment, each owning a field."""

from occviz.scenarios.controllers.scenario import scenario

__all__ = ["scenario"]
