"""The leader's guarded work: an increment the database rejects when its fencing token is stale.

A lease cannot stop a leader that has been paused (or cut off) from acting on
its old belief once it wakes: by then another replica may lead. So whatever the
leader does carries a fencing token, the Lease's `lease_transitions` when it
acquired, and the guarded row keeps the newest token it has seen. A write with an
older token matches no row: it is fenced.

This is not a compare-and-swap on `resource_version` (a blind write with ANY would
skip the token check, a checked one would make two writes of the same leader
conflict), so it is its own statement; it still moves the row's version by one,
as every write of a versioned object does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from occviz.scenarios.leader_election.connection import ReplicaConnection

# The row as it was before this statement (`before` reads the statement's snapshot; the CTE's
# update is not visible to it), joined with what the update wrote, if it matched, and the
# database's clock at the statement. A token older than the Lease's transitions is stale too:
# the Lease counted a newer holder, even if that holder has not written here yet.
_NEWEST = "GREATEST(fencing_token, COALESCE((SELECT lease_transitions FROM store_lease WHERE id = %s), 0))"
_FENCED_INCREMENT = f"""
WITH written AS (
    UPDATE store_counter
    SET value = value + 1, fencing_token = %s, resource_version = resource_version + 1
    WHERE id = %s AND {_NEWEST} <= %s
    RETURNING resource_version, value
)
SELECT before.resource_version, {_NEWEST.replace("fencing_token", "before.fencing_token")},
       written.resource_version, written.value, clock_timestamp()
FROM store_counter AS before LEFT JOIN written ON true
WHERE before.id = %s
"""
_READ_TOKEN = f"SELECT resource_version, {_NEWEST} FROM store_counter WHERE id = %s"

# Without fencing the increment lands whatever the token: the row only remembers the newest one seen.
_UNFENCED_INCREMENT = """
WITH written AS (
    UPDATE store_counter
    SET value = value + 1, fencing_token = GREATEST(fencing_token, %s), resource_version = resource_version + 1
    WHERE id = %s
    RETURNING resource_version, value
)
SELECT before.resource_version, before.fencing_token, written.resource_version, written.value, clock_timestamp()
FROM store_counter AS before JOIN written ON true
WHERE before.id = %s
"""


@dataclass(frozen=True, slots=True)
class FencedWrite:
    """What a guarded write did: landed (with the version and value it wrote) or fenced, and why."""

    token: int
    newest_token: int  # the newest token the row (or the Lease) had seen before this write
    version_read: int
    db_time: datetime
    version_written: int | None = None
    value: int | None = None

    @property
    def landed(self) -> bool:
        return self.version_written is not None


def fenced_increment(
    connection: ReplicaConnection, counter_id: int, token: int, lease_id: int | None = None
) -> FencedWrite:
    """`value + 1` on the guarded counter if `token` is not older than the newest token it (or the Lease) has seen."""
    row = connection.one(_FENCED_INCREMENT, [token, counter_id, lease_id, token, lease_id, counter_id])
    if row is None:
        raise LookupError(f"guarded counter {counter_id} was deleted while the election ran")
    version_read, newest_token, version_written, value, db_time = row
    if version_written is None and newest_token <= token:
        # Fenced by a write that committed after this statement's snapshot was taken (it waited on
        # that write's row lock, then saw the newer token): read the token that fenced it.
        version_read, newest_token = connection.one(_READ_TOKEN, [lease_id, counter_id]) or (version_read, newest_token)
    return FencedWrite(token, newest_token, version_read, db_time, version_written, value)


def unfenced_increment(connection: ReplicaConnection, counter_id: int, token: int) -> FencedWrite:
    """`value + 1` on the guarded counter whatever `token` says: the write of a replica that does not fence."""
    row = connection.one(_UNFENCED_INCREMENT, [token, counter_id, counter_id])
    if row is None:
        raise LookupError(f"guarded counter {counter_id} was deleted while the election ran")
    version_read, newest_token, version_written, value, db_time = row
    return FencedWrite(token, newest_token, version_read, db_time, version_written, value)
