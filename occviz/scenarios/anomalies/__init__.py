"""Hermitage's table, measured: every anomaly at every level, each run a step-mode job of its own."""

from occviz.scenarios.anomalies.scenario import scenario

__all__ = ["scenario"]
