"""The store's dry runs and impossible versions: `writes.dry_run()` takes every write back and tells no job;
a version past the bigint range is refused as stale, logged nowhere, never a database error."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.utils import timezone

from occviz.jobs.models import Job, JobControl
from occviz.store import writes
from occviz.store.models import Change, Counter, VersionConflict
from occviz.store.writes import MAX_VERSION, Writer

pytestmark = pytest.mark.django_db(transaction=True)

ALICE = Writer("api", "alice (token laptop)")


@pytest.fixture
def running_job() -> Job:
    now = timezone.now()
    running = Job.Status.RUNNING
    return Job.objects.create(scenario="counter", params={}, status=running, started_at=now, heartbeat_at=now)


def test_a_dry_run_update_and_delete_leave_the_row_the_log_and_the_job_untouched(running_job: Job) -> None:
    counter = Counter.objects.create(name="c", value=5, job=running_job)
    with writes.dry_run():
        written = writes.update(counter, {"value": 6}, ALICE, expected_version=1)
        assert (written.value, written.resource_version) == (6, 2)  # as the write would store it
        gone = writes.delete(written, ALICE, expected_version=2)
        assert not Counter.objects.filter(pk=counter.pk).exists()
    stored = Counter.objects.get(pk=counter.pk)
    assert (stored.value, stored.resource_version) == (5, 1) and gone.value == 6
    assert not Change.objects.exists() and not JobControl.objects.exists()
    running_job.refresh_from_db()
    assert running_job.controls_requested == 0
    # Outside a dry run the same write is logged and handed to the job: the checks above could fail.
    writes.update(counter, {"value": 6}, ALICE, expected_version=1)
    assert Change.objects.count() == 1 and JobControl.objects.filter(job=running_job).count() == 1


def test_a_dry_run_refusal_is_raised_and_not_logged() -> None:
    counter = Counter.objects.create(name="c", value=5)
    with pytest.raises(VersionConflict), writes.dry_run():
        writes.update(counter, {"value": 6}, ALICE, expected_version=7)
    assert not Change.objects.exists()


def test_a_dry_run_inside_a_transaction_takes_back_only_its_own_writes() -> None:
    counter = Counter.objects.create(name="c", value=5)
    with transaction.atomic():
        real = writes.update(counter, {"value": 6}, ALICE, expected_version=1)
        with writes.dry_run():
            writes.update(real, {"value": 7}, ALICE, expected_version=2)
        assert Counter.objects.get(pk=counter.pk).value == 6
    stored = Counter.objects.get(pk=counter.pk)
    assert (stored.value, stored.resource_version) == (6, 2)
    assert list(Change.objects.values_list("expected_version", flat=True)) == [1]


@pytest.mark.parametrize("version", [MAX_VERSION + 1, 9_999_999_999_999_999_999, 2**64 - 1])
def test_a_version_past_the_bigint_range_is_a_conflict_logged_nowhere(version: int) -> None:
    counter = Counter.objects.create(name="c", value=5)
    with pytest.raises(VersionConflict) as refused:
        writes.update(counter, {"value": 6}, ALICE, expected_version=version)
    assert refused.value.stored is not None and refused.value.stored.resource_version == 1
    with pytest.raises(VersionConflict):
        writes.delete(counter, ALICE, expected_version=version)
    assert Counter.objects.get(pk=counter.pk).resource_version == 1 and not Change.objects.exists()
    # A stale version in range is refused and logged: the refusal above is the bigint case alone.
    with pytest.raises(VersionConflict):
        writes.update(counter, {"value": 6}, ALICE, expected_version=MAX_VERSION)
    assert Change.objects.get().expected_version == MAX_VERSION
