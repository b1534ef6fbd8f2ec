"""What a Lease's holder writes when it lets go: client-go's ReleaseOnCancel."""

from __future__ import annotations

from datetime import datetime
from typing import Any


def released(lease_transitions: int, now: datetime) -> dict[str, Any]:
    """The Lease's fields after a release: no holder, a 1 s lease acquired and renewed `now`, the transitions kept.

    client-go writes this on ReleaseOnCancel, so the next candidate need not wait out the
    holder's full LeaseDuration; the replicas and the admin's release action write the same.
    """
    return {
        "holder_identity": "",
        "lease_duration_seconds": 1,
        "acquire_time": now,
        "renew_time": now,
        "lease_transitions": lease_transitions,
    }
