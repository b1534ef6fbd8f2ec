"""The quota race: pods racing through ResourceQuota admission, the leak of a failed create, the resync's repair."""

from occviz.scenarios.quota.scenario import scenario

__all__ = ["scenario"]
