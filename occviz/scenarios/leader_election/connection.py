"""One replica's own PostgreSQL session, through its proxy, and the statements the election runs on it.

A replica reads the Lease, writes it by compare-and-swap (occviz.store.cas, the
one path that moves a resource_version, with the database's clock at the write
returned by the same statement) and runs its guarded writes here, on a
PreparedSession of its own that connects through the replica's proxy. When a
statement fails (the proxy was cut, the server restarted) the session is dropped;
the next statement connects again, and `ensure()` says when that reconnection
happened so the replica can record it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from occviz.scenarios.leader_election.proxy import DatabaseProxy
from occviz.store.cas import NOW, compare_and_swap
from occviz.store.models import Lease
from occviz.store.session import PreparedSession

# What a lost or broken connection (or a failed statement) raises on a PreparedSession.
DB_ERRORS: tuple[type[Exception], ...] = (psycopg.Error,)

_READ_LEASE = (
    "SELECT holder_identity, lease_duration_seconds, acquire_time, renew_time, lease_transitions, resource_version "
    "FROM store_lease WHERE id = %s"
)


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """client-go's LeaderElectionRecord, as one Lease row holds it (with the version it was read at)."""

    holder_identity: str
    lease_duration_seconds: int
    acquire_time: datetime | None
    renew_time: datetime | None
    lease_transitions: int
    resource_version: int = 0

    def changes(self) -> dict[str, Any]:
        """The Lease columns a write of this record sets."""
        return {
            "holder_identity": self.holder_identity,
            "lease_duration_seconds": self.lease_duration_seconds,
            "acquire_time": self.acquire_time,
            "renew_time": self.renew_time,
            "lease_transitions": self.lease_transitions,
        }


@dataclass(frozen=True, slots=True)
class Written:
    """A compare-and-swap on the Lease that landed: the new version, and the database's clock at the write."""

    resource_version: int
    db_time: datetime


class ReplicaConnection:
    """A session of the replica's own with the job's database, routed through `proxy`."""

    def __init__(self, proxy: DatabaseProxy, using: str = "default") -> None:
        self._proxy = proxy
        self._using = using
        self._session: PreparedSession | None = None
        self._lost = False

    def ensure(self) -> bool:
        """Connect if needed; True when this re-established a connection lost to an error."""
        self._connected()
        reconnected, self._lost = self._lost, False
        return reconnected

    def _connected(self) -> PreparedSession:
        if self._session is None:
            # The alias' parameters, but the proxy's socket folder as host: cutting the proxy
            # cuts exactly this replica.
            self._session = PreparedSession(self._using, host=self._proxy.directory, port=self._proxy.port)
        return self._session

    def reset(self) -> None:
        """Drop the session after an error: the next statement connects again."""
        self._lost = True
        self.close()

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            with contextlib.suppress(*DB_ERRORS):
                session.close()

    def one(self, sql: str, params: list[Any]) -> tuple[Any, ...] | None:
        return self._connected().one(sql, params)

    def read_lease(self, lease_id: int) -> LeaseRecord:
        row = self.one(_READ_LEASE, [lease_id])
        if row is None:
            raise Lease.DoesNotExist(f"lease {lease_id} was deleted while the election ran")
        return LeaseRecord(*row)

    def write_lease(self, lease_id: int, expected_version: int, record: LeaseRecord) -> Written | None:
        """Compare-and-swap `record` onto the Lease; None if its version is no longer `expected_version`."""
        result = compare_and_swap(
            Lease,
            lease_id,
            expected_version,
            record.changes(),
            returning=("resource_version", NOW),
            cursor=self._connected(),
        )
        if result is None:
            return None
        return Written(*result)
