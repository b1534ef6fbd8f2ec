"""Leader election on a Lease: client-go's tryAcquireOrRenew, failure controls and fencing."""
