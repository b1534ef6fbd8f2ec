"""One replica's own PostgreSQL connection, through its proxy, and the statements the election runs on it.

A replica reads the Lease, writes it by compare-and-swap (occviz.store.cas, the
one path that moves a resource_version) and runs its guarded writes here. When a
statement fails (the proxy was cut, the server restarted) the connection is
dropped; the next statement connects again, and `ensure()` says when that
reconnection happened so the replica can record it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import django.db
import psycopg
from django.db import connections

from occviz.scenarios.leader_election.proxy import DatabaseProxy
from occviz.store.cas import compare_and_swap
from occviz.store.models import Lease

# What a lost or broken connection raises: Django's wrapped errors, or psycopg's own.
DB_ERRORS: tuple[type[Exception], ...] = (django.db.Error, psycopg.Error)

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
    """A connection of the replica's own to the job's database, routed through `proxy`."""

    def __init__(self, proxy: DatabaseProxy, using: str = "default") -> None:
        # A Django connection of its own (not the thread's shared one), with the alias' settings
        # but the proxy's socket folder as host: cutting the proxy cuts exactly this replica.
        self._wrapper = connections.create_connection(using)
        self._wrapper.settings_dict = {
            **self._wrapper.settings_dict,
            "HOST": proxy.directory,
            "PORT": str(proxy.port),
        }
        self._lost = False

    def ensure(self) -> bool:
        """Connect if needed; True when this re-established a connection lost to an error."""
        self._wrapper.ensure_connection()
        reconnected, self._lost = self._lost, False
        return reconnected

    def reset(self) -> None:
        """Drop the connection after an error: the next statement connects again."""
        self._lost = True
        with contextlib.suppress(*DB_ERRORS):
            self._wrapper.close()

    def close(self) -> None:
        with contextlib.suppress(*DB_ERRORS):
            self._wrapper.close()

    def one(self, sql: str, params: list[Any] | None = None) -> tuple[Any, ...] | None:
        with self._wrapper.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()

    def read_lease(self, lease_id: int) -> LeaseRecord:
        row = self.one(_READ_LEASE, [lease_id])
        if row is None:
            raise Lease.DoesNotExist(f"lease {lease_id} was deleted while the election ran")
        return LeaseRecord(*row)

    def write_lease(self, lease_id: int, expected_version: int, record: LeaseRecord) -> Written | None:
        """Compare-and-swap `record` onto the Lease; None if its version is no longer `expected_version`."""
        # The database's clock, read just before the write: a follower can only have seen this write
        # after it, so a leader judged valid from here until here + LeaseDuration never overlaps a
        # successor that waited out the lease by its own observation (see summary.py).
        (db_time,) = self.one("SELECT clock_timestamp()") or (None,)
        with self._wrapper.cursor() as cursor:
            result = compare_and_swap(Lease, lease_id, expected_version, record.changes(), cursor=cursor)
        if result is None:
            return None
        return Written(result[0], db_time)
