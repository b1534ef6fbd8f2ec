"""The versioned store: one compare-and-swap path, and nothing else moves a version."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from occviz.store.cas import ANY, NOW, Add, compare_and_swap
from occviz.store.models import Counter, Lease, VersionConflict
from occviz.store.session import PreparedSession

pytestmark = pytest.mark.django_db(transaction=True)


def test_compare_and_swap_writes_only_the_version_it_expects() -> None:
    counter = Counter.objects.create(name="c", value=5)
    assert compare_and_swap(Counter, counter.pk, 1, {"value": 6}) == (2,)
    # A writer still holding version 1 is refused, and its change does not land.
    assert compare_and_swap(Counter, counter.pk, 1, {"value": 100}) is None
    counter.refresh_from_db()
    assert (counter.value, counter.resource_version) == (6, 2)


def test_blind_and_atomic_writes_still_move_the_version() -> None:
    counter = Counter.objects.create(name="c", value=5)
    assert compare_and_swap(Counter, counter.pk, ANY, {"value": 1}) == (2,)
    assert compare_and_swap(Counter, counter.pk, ANY, {"value": Add(3)}, returning=("resource_version", "value")) == (
        3,
        4,
    )


def test_exactly_one_of_two_racing_writers_wins() -> None:
    counter = Counter.objects.create(name="c")
    barrier = threading.Barrier(8)
    results: list[tuple[int, ...] | None] = []

    def write(n: int) -> None:
        barrier.wait()
        results.append(compare_and_swap(Counter, counter.pk, 1, {"value": n}))
        from django.db import connection

        connection.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results, key=lambda r: r is None) == [(2,)] + [None] * 7


def test_model_compare_and_swap_raises_the_kubernetes_conflict() -> None:
    lease = Lease.objects.create(name="leader")
    stale = Lease.objects.get(pk=lease.pk)
    lease.compare_and_swap(holder_identity="a")
    assert lease.resource_version == 2
    with pytest.raises(VersionConflict) as conflict:
        stale.compare_and_swap(holder_identity="b")
    assert str(conflict.value) == (
        'Operation cannot be fulfilled on leases.coordination.k8s.io "leader": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    assert Lease.objects.get(pk=lease.pk).holder_identity == "a"


def test_a_plain_save_cannot_overwrite_a_versioned_object() -> None:
    counter = Counter.objects.create(name="c")
    counter.value = 10
    with pytest.raises(TypeError, match="compare_and_swap"):
        counter.save()
    assert Counter.objects.get(pk=counter.pk).resource_version == 1


def test_an_admin_edit_goes_through_compare_and_swap() -> None:
    User.objects.create_superuser("admin", "admin@example.com", "pw-for-admin")
    client = Client()
    client.login(username="admin", password="pw-for-admin")
    counter = Counter.objects.create(name="c", value=1)
    url = f"/admin/store/counter/{counter.pk}/change/"
    # The form carries the version it loaded (without it the admin refuses to write: tests/test_admin.py).
    loaded = re.search(r'name="loaded" value="([^"]*)"', client.get(url).content.decode())
    assert loaded is not None
    response = client.post(url, {"namespace": "default", "name": "c", "value": "42", "loaded": loaded.group(1)})
    assert response.status_code == 302
    counter.refresh_from_db()
    assert (counter.value, counter.resource_version) == (42, 2)


@pytest.fixture(params=["django cursor", "prepared session"])
def cursor(request: pytest.FixtureRequest) -> Iterator[PreparedSession | None]:
    """What a compare-and-swap runs on: Django's own cursor (None), or a writer's PreparedSession."""
    if request.param == "django cursor":
        yield None
        return
    session = PreparedSession()
    try:
        yield session
    finally:
        session.close()


def _database_clock() -> datetime:
    with connection.cursor() as clock:
        clock.execute("SELECT clock_timestamp()")
        (now,) = clock.fetchone()
    return now


def test_now_sets_a_column_to_the_databases_clock_at_the_write(cursor: PreparedSession | None) -> None:
    lease = Lease.objects.create(name="leader")
    before = _database_clock()
    version, renewed = compare_and_swap(
        Lease, lease.pk, 1, {"renew_time": NOW}, returning=("resource_version", "renew_time"), cursor=cursor
    )
    after = _database_clock()
    assert version == 2
    assert before <= renewed <= after
    lease.refresh_from_db()
    assert lease.renew_time == renewed


def test_now_in_returning_is_the_databases_clock_at_the_write(cursor: PreparedSession | None) -> None:
    lease = Lease.objects.create(name="leader")
    before = _database_clock()
    version, written_at = compare_and_swap(
        Lease, lease.pk, 1, {"holder_identity": "a"}, returning=("resource_version", NOW), cursor=cursor
    )
    after = _database_clock()
    assert version == 2
    assert before <= written_at <= after
    # A conflict writes nothing, and returns no time either.
    assert compare_and_swap(Lease, lease.pk, 1, {"holder_identity": "b"}, returning=(NOW,), cursor=cursor) is None


def test_now_is_when_the_row_was_written_not_when_its_transaction_began() -> None:
    lease = Lease.objects.create(name="leader")
    session = PreparedSession()
    try:
        with session.transaction():
            (began,) = session.one("SELECT now()", [])
            # A writer that waited (for a lock, for the interpreter) between BEGIN and its write.
            time.sleep(0.05)
            (renewed,) = compare_and_swap(
                Lease, lease.pk, 1, {"renew_time": NOW}, returning=("renew_time",), cursor=session
            )
    finally:
        session.close()
    assert renewed - began >= timedelta(milliseconds=50)
