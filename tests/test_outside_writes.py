"""Writes from outside a job (the admin, the API) to a running counter race: lanes of the job, no update lost.

A real counter job runs through the runner (its writers are threads on their own
connections) while a thread of this test increments the same row through
`occviz.store.writes`, as the API and the admin do: read, think, compare-and-swap with
the version it read, re-read and retry on a conflict. Think time on both sides makes
the two collide.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import psycopg
import pytest

from occviz.jobs.models import Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.scenarios import SCENARIOS
from occviz.store import writes
from occviz.store.cas import ANY
from occviz.store.models import Counter, VersionConflict
from tests.helpers import JobThread, events, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ALICE = writes.Writer("api", "alice (token laptop)")


def _job_row(job_id: int, timeout: float = 20.0) -> Counter:
    """The job's first row, once its writers are writing it: an outside writer that starts then
    races them, where one that starts as soon as the row exists may be done before they connect."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = Counter.objects.filter(job_id=job_id).order_by("pk").first()
        if row is not None and row.resource_version > 5:
            return row
        time.sleep(0.002)
    raise AssertionError(f"job {job_id}'s writers wrote nothing within {timeout} s")


def _until_written_past(row: Counter, timeout: float = 20.0) -> None:
    """Wait until a writer of the job commits over the version `row` read: the first
    compare-and-swap then meets a conflict for certain, a race made rather than hoped for
    (on a loaded machine the job's threads can all be asleep through twenty quick increments)."""
    deadline = time.monotonic() + timeout
    while Counter.objects.get(pk=row.pk).resource_version == row.resource_version:
        if time.monotonic() > deadline:
            raise AssertionError(f"no writer of the job wrote over version {row.resource_version} within {timeout} s")
        time.sleep(0.001)


class OutsideIncrementer(threading.Thread):
    """Read-modify-write increments of the job's row through store.writes, retried on conflict.
    The first attempt waits for the job to write between its read and its compare-and-swap."""

    def __init__(self, job_id: int, increments: int, think_s: float, writer: writes.Writer = ALICE) -> None:
        super().__init__(name="outside-writer")
        self.job_id, self.increments, self.think_s, self.writer = job_id, increments, think_s, writer
        self.committed = 0
        self.conflicts = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        from django.db import connection

        rng = random.Random(7)
        try:
            row = _job_row(self.job_id)
            for _ in range(self.increments):
                while True:
                    row = Counter.objects.get(pk=row.pk)
                    time.sleep(self.think_s * rng.uniform(0.5, 1.5))
                    if self.committed == self.conflicts == 0:
                        _until_written_past(row)
                    try:
                        writes.update(row, {"value": row.value + 1}, self.writer, expected_version=row.resource_version)
                    except VersionConflict:
                        self.conflicts += 1
                        continue
                    self.committed += 1
                    break
        except BaseException as error:  # reported by the test
            self.error = error
        finally:
            connection.close()


def _run_with(outside: OutsideIncrementer) -> Job:
    outside.start()
    job = run_job(outside.job_id)
    outside.join(timeout=60)
    assert outside.error is None, outside.error
    return job


def test_api_increments_and_the_job_share_one_counter_and_no_update_is_lost(alice: Any) -> None:
    # The job outlasts the outside writer (about 0.2 s of work against several seconds).
    params = {"strategy": "occ", "writers": 4, "increments": 300, "think_ms": 3, "max_attempts": 50}
    job = create_job("counter", params, alice)
    outside = OutsideIncrementer(job.pk, increments=40, think_s=0.003)
    job = _run_with(outside)

    summary = job.summary
    assert job.status == Job.Status.SUCCEEDED, job.error
    assert summary["invariant_ok"], summary["invariant"]
    row = Counter.objects.get(job=job)
    assert row.value == summary["final_value"] == summary["committed"] + outside.committed
    assert summary["committed"] + summary["gave_up"] == 4 * 300
    assert summary["outside_writes"] == outside.committed == 40
    assert summary["outside_delta"] == 40
    assert summary["lost_updates"] == 0
    assert "from 40 outside writes: no update lost" in summary["invariant"]
    # The race happened, on both sides.
    assert outside.conflicts > 0, "the outside writer never collided: raise the think time"
    assert summary["conflicts"] > 0

    lane = events(job, "outside_write", "outside_conflict")
    assert {e.actor for e in lane} == {5}  # one lane, after the job's four writers
    assert sum(e.kind == "outside_write" for e in lane) == outside.committed
    assert sum(e.kind == "outside_conflict" for e in lane) == outside.conflicts == summary["outside_conflicts"]
    assert all(e.detail["lane"] == "api: alice (token laptop)" for e in lane)
    commit = next(e for e in lane if e.kind == "outside_write")
    assert commit.version_written == commit.version_read + 1
    assert commit.value_written == commit.value_read + 1
    refused = next(e for e in lane if e.kind == "outside_conflict")
    assert refused.detail["stored_version"] > refused.version_read

    spec = SCENARIOS["counter"]
    said = spec.describe({"actor": refused.actor, "kind": refused.kind, **_fields(refused)})
    assert said == (
        f"alice (token laptop) via the API: conflict, had v{refused.version_read}, "
        f"stored v{refused.detail['stored_version']}"
    )


def test_a_blind_outside_write_over_the_jobs_increments_is_counted_as_lost(alice: Any) -> None:
    params = {"strategy": "occ", "writers": 2, "increments": 80, "think_ms": 2}
    job = create_job("counter", params, alice)
    bob = writes.Writer("admin", "bob")

    def overwrite() -> None:
        from django.db import connection

        try:
            row = _job_row(job.pk)
            while Counter.objects.get(pk=row.pk).value < 30:
                time.sleep(0.005)
            writes.update(Counter.objects.get(pk=row.pk), {"value": 5}, bob, expected_version=ANY)
        finally:
            connection.close()

    thread = threading.Thread(target=overwrite)
    thread.start()
    job = run_job(job.pk)
    thread.join()

    summary = job.summary
    blind = events(job, "outside_write")
    assert len(blind) == 1 and blind[0].detail["blind"] == "blind"
    erased = blind[0].value_read - 5
    assert erased >= 25
    assert blind[0].detail["erased"] == erased
    assert summary["lost_to_outside_blind_writes"] == erased
    assert summary["lost_updates"] == erased
    # The job itself lost nothing: its accounting holds, and the verdict names who erased what.
    assert summary["invariant_ok"], summary["invariant"]
    assert f"{erased} increments erased by blind outside writes ({erased} by admin: bob)" in summary["invariant"]
    assert Counter.objects.get(job=job).value == summary["committed"] - erased


def test_a_write_after_the_job_is_not_its_event(alice: Any) -> None:
    job = run_job(create_job("counter", {"strategy": "occ", "writers": 1, "increments": 3}, alice).pk)
    row = Counter.objects.get(job=job)
    writes.update(row, {"value": 100}, ALICE, expected_version=row.resource_version)
    assert not events(job, "outside_write")


def _fields(event: Any) -> dict[str, Any]:
    return {
        "version_read": event.version_read,
        "version_written": event.version_written,
        "value_read": event.value_read,
        "value_written": event.value_written,
        "detail": event.detail,
    }


class OutsideElector(threading.Thread):
    """A client of its own in the election, as the official client's LeaseLock writes: read, then replace
    with the version read; acquire once the holder's lease expired by its own observation; renew
    for `hold_s`, then stop renewing (no release, like a killed client)."""

    def __init__(self, job_id: int, me: str, *, hold_s: float, poll_s: float = 0.05) -> None:
        super().__init__(name="outside-elector")
        self.job_id, self.me, self.hold_s, self.poll_s = job_id, me, hold_s, poll_s
        self.acquired_at: float | None = None
        self.joined = False
        self.conflicts = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        from django.db import connection
        from django.utils import timezone

        from occviz.store.models import Lease

        try:
            deadline = time.monotonic() + 30
            seen: tuple[int, float] | None = None  # (version, when this client saw it change)
            while time.monotonic() < deadline:
                lease = Lease.objects.filter(job_id=self.job_id).first()
                # It joins once a replica leads, so that it has to wait that leader's lease out.
                if lease is not None and lease.holder_identity and not self.joined:
                    self.joined = True
                if self.joined and Job.objects.filter(pk=self.job_id, status=Job.Status.RUNNING).exists():
                    assert lease is not None
                    if seen is None or seen[0] != lease.resource_version:
                        seen = (lease.resource_version, time.monotonic())
                    now = timezone.now()
                    changes: dict[str, Any] | None = None
                    if lease.holder_identity == self.me:
                        if time.monotonic() - (self.acquired_at or 0) > self.hold_s:
                            return  # stops renewing: the replicas take over once its lease expires
                        changes = {"renew_time": now}
                    elif not lease.holder_identity or time.monotonic() - seen[1] > lease.lease_duration_seconds:
                        changes = {
                            "holder_identity": self.me,
                            "lease_duration_seconds": 1,
                            "acquire_time": now,
                            "renew_time": now,
                            "lease_transitions": lease.lease_transitions + 1,
                        }
                    if changes is not None:
                        try:
                            writes.update(lease, changes, ALICE, expected_version=lease.resource_version)
                        except VersionConflict:
                            self.conflicts += 1
                        else:
                            if "holder_identity" in changes:
                                self.acquired_at = time.monotonic()
                time.sleep(self.poll_s if self.acquired_at is None else 0.2)
        except BaseException as error:  # reported by the test
            self.error = error
        finally:
            connection.close()


def test_an_outside_client_wins_renews_and_loses_the_jobs_lease_as_a_replica(alice: Any) -> None:
    # Once the killed leader's lease has run out, the client (looking every 0.05 s) and the other replica
    # (every retry period, 0.5 to 1.1 s with client-go's jitter) race for it by the same rule. The replica
    # sees the leader's last renewal up to a period late, and looks again up to a period after its lease ran
    # out by its clock: the client wins by most of a period. With a period of 0.2 s the client lost, once, on a
    # loaded machine, and a replica that wins renews too often for the client ever to see the lease run out.
    params = {
        "replicas": 2,
        "lease_duration": 1,
        "renew_deadline": 0.7,
        "retry_period": 0.5,
        "seconds": 7,
        "kill_leader_at": 1,
    }
    job = create_job("leader-election", params, alice)
    client = OutsideElector(job.pk, "alice-laptop", hold_s=1.5)
    client.start()
    job = run_job(job.pk)
    client.join(timeout=30)
    assert client.error is None, client.error
    assert client.acquired_at is not None, "the outside client never acquired the lease"

    summary = job.summary
    assert summary["invariant_ok"], summary["invariant"]
    assert summary["max_leaders_at_once"] == 1
    every = events(job)
    lane = [e for e in every if e.detail.get("lane") == "alice-laptop"]
    kinds = [e.kind for e in lane]
    assert "acquired" in kinds and kinds.count("renewed") >= 3, kinds
    assert len({e.actor for e in lane}) == 1 and lane[0].actor > params["replicas"]
    acquired = next(e for e in lane if e.kind == "acquired")
    assert acquired.value_written == acquired.value_read + 1
    # After it stopped renewing, a replica took the lease from it.
    last = max(e.seq for e in lane if e.kind in ("acquired", "renewed"))
    taken = [e for e in every if e.seq > last and e.kind == "acquired" and e.actor <= params["replicas"]]
    assert taken and taken[0].detail["holder"] == "alice-laptop"
    leaders = [(entry["identity"], entry["ended"]) for entry in summary["leaders"]]
    assert ("alice-laptop", "taken over") in leaders
    said = SCENARIOS["leader-election"].describe({"actor": acquired.actor, "kind": "acquired", **_fields(acquired)})
    assert said == (
        f"alice-laptop (alice (token laptop) via the API) acquired the lease from {acquired.detail['holder']} "
        f"(transition {acquired.value_written})."
    )


def test_presses_queued_on_the_jobs_row_while_the_job_settles_neither_deadlock_nor_fail_it() -> None:
    """Students' presses lock the job's row, then the hot row (occviz.students.presses), back to back
    as a class does. The job's settling at its end takes them in the same order: taken the other way
    round (the hot row, then the job's row, behind a queue of presses), PostgreSQL found the circle
    and failed the job's transaction as the deadlock's victim."""
    from django.db import connection

    job = create_job("counter", {"strategy": "occ", "writers": 2, "seconds": 1, "think_ms": 5})
    runner = JobThread(job.pk)
    runner.start()
    row = wait_for(lambda: Counter.objects.filter(job_id=job.pk).first(), 30, "the job's row")
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    pressed = [0] * 6

    def presses(number: int) -> None:
        with psycopg.connect(**params) as press:
            while runner.is_alive():
                try:
                    with press.transaction():
                        press.execute("SET LOCAL lock_timeout = '2s'")
                        press.execute("SELECT 1 FROM jobs_job WHERE id = %s FOR NO KEY UPDATE", [job.pk])
                        press.execute("SET LOCAL lock_timeout = '250ms'")
                        press.execute("SELECT value FROM store_counter WHERE id = %s FOR UPDATE", [row.pk])
                        time.sleep(0.01)  # the press's few statements with the row held
                    pressed[number] += 1
                except psycopg.errors.LockNotAvailable:
                    pass  # refused as busy, as a press is while the job settles

    threads = [threading.Thread(target=presses, args=(n,)) for n in range(len(pressed))]
    for thread in threads:
        thread.start()
    runner.join(60)
    for thread in threads:
        thread.join(10)
    ended = runner.ran[0]
    assert ended.status == Job.Status.SUCCEEDED, ended.error
    assert sum(pressed) > 10, pressed
