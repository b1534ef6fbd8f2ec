"""A writer's PreparedSession sends and reads the store's types as psycopg does, on real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import connection

from occviz.store.cas import compare_and_swap
from occviz.store.models import Lease, Pod, ResourceQuota
from occviz.store.session import PreparedSession

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def session() -> Iterator[PreparedSession]:
    session = PreparedSession()
    try:
        yield session
    finally:
        session.close()


def test_a_lease_written_through_the_session_reads_back_its_datetimes(session: PreparedSession) -> None:
    lease = Lease.objects.create(name="leader")
    acquired = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
    renewed = acquired + timedelta(seconds=7, microseconds=1)
    changes = {"holder_identity": "writer-3", "acquire_time": acquired, "renew_time": renewed, "lease_transitions": 1}
    returned = compare_and_swap(
        Lease, lease.pk, 1, changes, returning=("resource_version", "acquire_time", "renew_time"), cursor=session
    )
    assert returned == (2, acquired, renewed)
    lease.refresh_from_db()
    assert (lease.holder_identity, lease.acquire_time, lease.renew_time, lease.lease_transitions) == (
        "writer-3",
        acquired,
        renewed,
        1,
    )
    row = session.one("SELECT acquire_time, renew_time FROM store_lease WHERE id = %s", [lease.pk])
    assert row == (acquired, renewed)
    assert row is not None and all(value.utcoffset() == timedelta(0) for value in row)


def test_json_fields_go_as_jsonb_and_come_back_as_dicts_and_lists(session: PreparedSession) -> None:
    quota = ResourceQuota.objects.create(name="gpus", hard={"requests.nvidia.com/gpu": 2})
    used = {"requests.nvidia.com/gpu": 1, "pods": ["a", "b"]}
    # Through compare_and_swap, as the quota scenario writes: Django wraps the value in psycopg's Jsonb.
    assert compare_and_swap(ResourceQuota, quota.pk, 1, {"used": used}, returning=("used",), cursor=session) == (used,)
    quota.refresh_from_db()
    assert (quota.hard, quota.used) == ({"requests.nvidia.com/gpu": 2}, used)
    # A bare dict or list bound to a jsonb parameter goes as jsonb: an object or an array, not a JSON string.
    pod = Pod.objects.create(name="p")
    for requests in ({"requests.nvidia.com/gpu": 1}, [1, "two", None]):
        row = session.one(
            "UPDATE store_pod SET requests = %s WHERE id = %s RETURNING requests, jsonb_typeof(requests)",
            [requests, pod.pk],
        )
        assert row == (requests, "object" if isinstance(requests, dict) else "array")
    pod.refresh_from_db()
    assert pod.requests == [1, "two", None]


def test_integers_booleans_text_and_null_round_trip_with_their_types(session: PreparedSession) -> None:
    sent = (2**40, 7, True, False, "héllo, 'world'", None)
    row = session.one("SELECT %s::bigint, %s::integer, %s::boolean, %s::boolean, %s::text, %s::text", sent)
    assert row == sent
    assert row is not None and [type(value) for value in row] == [int, int, bool, bool, str, type(None)]


def test_a_statement_with_no_row_returns_none_and_a_failed_one_raises_psycopgs_error(
    session: PreparedSession,
) -> None:
    assert session.one("SELECT id FROM store_lease WHERE id = %s", [-1]) is None
    with pytest.raises(psycopg.errors.DivisionByZero):
        session.one("SELECT 1 / %s::integer", [0])


def test_connection_parameters_can_be_overridden() -> None:
    overridden = PreparedSession(host=connection.settings_dict["HOST"], application_name="occviz-through-proxy")
    try:
        assert overridden.one("SELECT current_database(), current_setting('application_name')", []) == (
            connection.settings_dict["NAME"],
            "occviz-through-proxy",
        )
    finally:
        overridden.close()
    with pytest.raises(psycopg.OperationalError):
        PreparedSession(host="/nonexistent-socket-dir")
