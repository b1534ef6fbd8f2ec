"""Writes from outside a job (the admin's, the API's): checked, logged as Changes, told to the owning job."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from django.contrib.auth.models import User
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DataError, connection, transaction

from occviz.jobs.models import Job, JobControl
from occviz.store import writes
from occviz.store.cas import ANY, Add, compare_and_swap
from occviz.store.models import Change, Counter, Deployment, Lease, Pod, ResourceQuota, VersionConflict
from occviz.store.writes import AlreadyExists, Writer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def api_alice(alice: User) -> Writer:
    return Writer("api", "alice (token laptop)", alice)


def test_an_update_on_the_version_read_is_written_and_logged(api_alice: Writer) -> None:
    counter = Counter.objects.create(name="c", value=5)
    written = writes.update(counter, {"value": 6}, api_alice, expected_version=1)
    assert (written.value, written.resource_version) == (6, 2)
    change = Change.objects.get()
    assert (change.type, change.resource, change.resource_version, change.expected_version) == (
        "MODIFIED",
        "counters",
        2,
        1,
    )
    assert (change.via, change.writer, change.user, change.object["value"]) == (
        "api",
        "alice (token laptop)",
        api_alice.user,
        6,
    )
    assert not change.blind


_EVERY_KIND = {
    "counter": (Counter, {"value": 5}, {"value": 6}),
    "pod": (
        Pod,
        {"requests": {"cpu": "1"}, "phase": "Pending"},
        {"requests": {"cpu": "2", "gpu": 1}, "phase": "Running"},
    ),
    "lease": (
        Lease,
        {"holder_identity": "a", "acquire_time": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "renew_time": None},
        # Microseconds are cut to milliseconds, not rounded; a time without any has no fraction.
        {"holder_identity": "b", "renew_time": datetime(2026, 1, 2, 3, 4, 6, 999_999, tzinfo=UTC)},
    ),
    "quota": (ResourceQuota, {"hard": {"pods": 2}, "used": {}}, {"used": {"pods": 1, "a": [1, None, "x"]}}),
    "deployment": (
        Deployment,
        {"replicas": 2, "labels": {"app": "web"}, "annotations": {}, "status": {}},
        {"replicas": 3, "annotations": {"a/b": "1"}, "status": {"ready": True}},
    ),
}


@pytest.mark.parametrize("kind", _EVERY_KIND)
def test_the_log_and_the_hand_off_hold_the_fields_as_python_reads_them(api_alice: Writer, kind: str) -> None:
    """The database writes the JSON of the Change and of the job's hand-off; it is what `fields_of` makes."""
    model, fields, changes = _EVERY_KIND[kind]
    job = Job.objects.create(scenario="counter", status=Job.Status.RUNNING)
    obj = model.objects.create(name="o", job=job, **fields)
    before = writes.fields_of(model.objects.get())
    written = writes.update(obj, changes, api_alice, expected_version=1)
    after = writes.fields_of(model.objects.get())
    assert after == writes.fields_of(written) and after != before
    with pytest.raises(VersionConflict):
        writes.update(obj, changes, api_alice, expected_version=1)
    gone = writes.delete(written, api_alice, expected_version=2)
    assert writes.fields_of(gone) == after
    modified, refused, deleted = Change.objects.all()
    assert modified.object == after and modified.stored is None
    assert refused.stored == after and refused.object == after | json.loads(json.dumps(changes, cls=DjangoJSONEncoder))
    assert deleted.object == after and (deleted.type, deleted.resource_version) == ("DELETED", 2)
    payloads = [control.payload for control in JobControl.objects.order_by("pk")]
    assert [(p["before"], p["after"], p["change"]) for p in payloads] == [
        (before, after, modified.pk),
        (after, refused.object, refused.pk),
        (after, after, deleted.pk),
    ]


def test_a_stale_update_writes_nothing_and_logs_the_refusal(api_alice: Writer) -> None:
    counter = Counter.objects.create(name="c", value=5)
    compare_and_swap(Counter, counter.pk, 1, {"value": 9})  # someone else wrote meanwhile
    with pytest.raises(VersionConflict) as conflict:
        writes.update(counter, {"value": 6}, api_alice, expected_version=1)
    assert str(conflict.value).startswith('Operation cannot be fulfilled on counters.occviz.dev "c"')
    assert conflict.value.stored is not None and conflict.value.stored.value == 9
    counter.refresh_from_db()
    assert (counter.value, counter.resource_version) == (9, 2)
    change = Change.objects.get()
    assert (change.type, change.resource_version, change.expected_version) == ("CONFLICT", 2, 1)
    assert (change.object["value"], change.stored["value"]) == (6, 9)


def test_a_blind_update_is_written_and_shown_as_blind(api_alice: Writer) -> None:
    lease = Lease.objects.create(name="demo")
    compare_and_swap(Lease, lease.pk, 1, {"holder_identity": "a"})
    written = writes.update(lease, {"holder_identity": "b"}, api_alice, expected_version=ANY)
    assert (written.holder_identity, written.resource_version) == ("b", 3)
    assert Change.objects.get().blind


def test_create_refuses_a_second_object_of_the_same_name(api_alice: Writer) -> None:
    writes.create(Lease, {"name": "demo", "holder_identity": "x"}, api_alice)
    with pytest.raises(AlreadyExists, match=r'leases\.coordination\.k8s\.io "demo" already exists'):
        writes.create(Lease, {"name": "demo"}, api_alice)
    assert Lease.objects.count() == 1
    assert list(Change.objects.values_list("type", flat=True)) == ["ADDED"]


def test_delete_checks_the_version_when_one_is_given(api_alice: Writer) -> None:
    lease = writes.create(Lease, {"name": "demo"}, api_alice)
    compare_and_swap(Lease, lease.pk, 1, {"holder_identity": "a"})
    with pytest.raises(VersionConflict):
        writes.delete(lease, api_alice, expected_version=1)
    assert Lease.objects.filter(pk=lease.pk).exists()
    writes.delete(lease, api_alice, expected_version=2)
    assert not Lease.objects.filter(pk=lease.pk).exists()
    assert list(Change.objects.values_list("type", flat=True)) == ["ADDED", "CONFLICT", "DELETED"]


def test_writes_to_a_running_jobs_object_are_handed_to_the_job(api_alice: Writer) -> None:
    job = Job.objects.create(scenario="counter", status=Job.Status.RUNNING)
    finished = Job.objects.create(scenario="counter", status=Job.Status.SUCCEEDED)
    counter = Counter.objects.create(name="c", job=job)
    other = Counter.objects.create(name="d", job=finished)
    writes.update(counter, {"value": 1}, api_alice, expected_version=1)
    with pytest.raises(VersionConflict):
        writes.update(counter, {"value": 2}, api_alice, expected_version=1)
    writes.update(other, {"value": 1}, api_alice, expected_version=1)
    controls = list(JobControl.objects.filter(job=job))
    assert [c.payload["type"] for c in controls] == ["MODIFIED", "CONFLICT"]
    assert controls[0].payload["before"]["value"] == 0 and controls[0].payload["after"]["value"] == 1
    assert controls[1].payload["writer"] == "alice (token laptop)"
    assert Job.objects.get(pk=job.pk).controls_requested == 2
    assert not JobControl.objects.filter(job=finished).exists()


def test_uid_is_stable_and_differs_between_objects() -> None:
    a = Lease.objects.create(name="a")
    b = Lease.objects.create(name="b")
    assert a.uid == Lease.objects.get(pk=a.pk).uid != b.uid


def _racing(count: int, write: Callable[[int], None]) -> None:
    """Run `write(n)` in `count` threads released together, each on a connection of its own."""
    barrier = threading.Barrier(count)

    def run(n: int) -> None:
        try:
            barrier.wait()
            write(n)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _in_a_transaction(way: str) -> contextlib.AbstractContextManager[None]:
    """A write transaction: statement by statement, pipelined, or a pipelined transaction (its commit pipelined too)."""
    if way == "pipelined transaction":
        return writes.pipelined_transaction()
    stack = contextlib.ExitStack()
    stack.enter_context(transaction.atomic())
    if way == "pipelined":
        stack.enter_context(writes.pipelined())
    return stack


WAYS = ["statement by statement", "pipelined", "pipelined transaction"]


@pytest.mark.parametrize("way", WAYS)
def test_racing_writers_each_log_what_they_found_locked_in_the_order_they_held_it(api_alice: Writer, way: str) -> None:
    """Writers queue for the row while another transaction holds it and writes it: each one's Change and hand-off
    say what was stored when it got the row (not what its statement's snapshot saw), and the Changes' ids follow
    the versions they wrote."""
    job = Job.objects.create(scenario="counter", status=Job.Status.RUNNING)
    counter = Counter.objects.create(name="c", job=job)
    holding = threading.Event()

    def hold_then_write() -> None:
        with transaction.atomic():
            list(Counter.objects.select_for_update().filter(pk=counter.pk))
            holding.set()
            time.sleep(0.3)  # the writers' statements start meanwhile, and wait for the row
            compare_and_swap(Counter, counter.pk, ANY, {"value": 100})

    def write(n: int) -> None:
        if n == 0:
            hold_then_write()
            return
        holding.wait()
        blind = n % 2 == 0
        changes = {"value": Add(1)} if blind else {"value": 1000 + n}
        with _in_a_transaction(way), contextlib.suppress(VersionConflict):
            writes.update(counter, changes, Writer("student", f"s{n}"), expected_version=ANY if blind else 1)

    _racing(9, write)
    counter.refresh_from_db()
    changes = list(Change.objects.filter(object_id=counter.pk).order_by("id"))
    written = [change for change in changes if change.type == "MODIFIED"]
    assert (counter.value, counter.resource_version) == (100 + len(written), 2 + len(written))
    assert len(written) == 4 and len(changes) == 8  # the four blind writers wrote; the four on version 1 were refused
    assert [change.resource_version for change in written] == [3, 4, 5, 6]
    assert [change.object["value"] for change in written] == [101, 102, 103, 104]
    assert all(change.stored["value"] >= 100 for change in changes if change.type == "CONFLICT")
    handed = {control.payload["change"]: control.payload for control in JobControl.objects.filter(job=job)}
    assert sorted(handed) == [change.pk for change in changes]
    for change in written:
        assert handed[change.pk]["before"]["value"] == change.object["value"] - 1
    assert Job.objects.get(pk=job.pk).controls_requested == 8


@pytest.mark.parametrize("way", WAYS[1:])
def test_a_pipelined_write_that_fails_as_the_pipeline_ends_leaves_nothing(api_alice: Writer, way: str) -> None:
    """In a pipeline, a statement that waits for no answer fails where the answer is read, as the pipeline ends
    (or with the commit sent behind it): and then the write, its Change and its hand-off are all rolled back."""
    job = Job.objects.create(scenario="counter", status=Job.Status.RUNNING)
    counter = Counter.objects.create(name="c", job=job, value=5)
    with pytest.raises(DataError), _in_a_transaction(way):
        writes.update(counter, {"value": 6}, api_alice, expected_version=1)
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")  # no answer read: raised as the pipeline ends
    counter.refresh_from_db()
    assert (counter.value, counter.resource_version) == (5, 1)
    assert not Change.objects.exists() and not JobControl.objects.exists()
    with _in_a_transaction(way):  # the connection is usable again
        assert writes.update(counter, {"value": 7}, api_alice, expected_version=1).value == 7
    assert Change.objects.get().resource_version == 2 and JobControl.objects.count() == 1


def test_the_last_write_of_a_pipelined_transaction_goes_with_its_commit(api_alice: Writer, tmp_path: Path) -> None:
    """The row is held for one statement: the one that locks, writes and logs it and hands it to the job, sent
    with the COMMIT before the pipeline's sync and before any answer (as the client's protocol trace shows)."""
    job = Job.objects.create(scenario="counter", status=Job.Status.RUNNING)
    counter = Counter.objects.create(name="c", job=job)
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with (tmp_path / "trace").open("w") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            with writes.pipelined_transaction():
                written = writes.update(counter, {"value": 1}, api_alice, expected_version=1, last=True)
        finally:
            pgconn.untrace()
    sent = [line.split("\t") for line in (tmp_path / "trace").read_text().splitlines()]
    write = next(n for n, line in enumerate(sent) if line[2] == "Parse" and 'WITH "old"' in line[3])
    # Everything from the write to the next sync: the client's messages only, the COMMIT among them.
    flight = sent[write : write + next(n for n, line in enumerate(sent[write:]) if line[2] == "Sync")]
    assert {line[0] for line in flight} == {"F"}
    assert [line[3].split()[1] for line in flight if line[2] == "Parse"][1:] == ['"COMMIT"']
    assert written.value == 1 and written.resource_version == 2
    assert Change.objects.get().resource_version == 2 and JobControl.objects.get().payload["after"]["value"] == 1


def test_a_last_write_needs_a_pipelined_transaction_and_writes_nothing_without_one(api_alice: Writer) -> None:
    counter = Counter.objects.create(name="c")
    for outside in (contextlib.nullcontext(), transaction.atomic()):
        with outside, pytest.raises(transaction.TransactionManagementError, match="pipelined_transaction"):
            writes.update(counter, {"value": 1}, api_alice, expected_version=1, last=True)
    assert Counter.objects.get().resource_version == 1 and not Change.objects.exists()


def test_a_pipelined_transaction_is_refused_inside_another_transaction(api_alice: Writer) -> None:
    counter = Counter.objects.create(name="c")
    with transaction.atomic():
        with pytest.raises(transaction.TransactionManagementError), writes.pipelined_transaction():
            writes.update(counter, {"value": 1}, api_alice, expected_version=1)
        assert Counter.objects.get().resource_version == 1  # nothing was written, and nothing committed
