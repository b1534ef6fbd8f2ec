"""Leader election on a Lease: client-go's tryAcquireOrRenew, failure controls and fencing."""

from occviz.scenarios.leader_election.scenario import scenario

__all__ = ["scenario"]
