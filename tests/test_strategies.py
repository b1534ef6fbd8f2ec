"""The five strategies on real PostgreSQL, with races made to happen by think time and many writers."""

from __future__ import annotations

import pytest

from occviz.concurrency.retry import make_policy
from occviz.jobs.models import Event
from occviz.scenarios import SCENARIOS
from occviz.scenarios.base import fill
from occviz.store.models import Counter, conflict_message
from tests.helpers import events, rows_of, run_counter

pytestmark = pytest.mark.django_db(transaction=True)


def test_none_loses_updates_and_counts_them_exactly() -> None:
    job = run_counter(strategy="none", writers=8, increments=25, think_ms=3, seed=1)
    summary = job.summary
    assert job.status == "succeeded"
    (row,) = rows_of(job)
    # What the database shows: every blind write moved the version by one, but only some moved the value.
    writes_landed = row.resource_version - 1
    value_gained = row.value - 0
    assert summary["committed"] == 8 * 25 == writes_landed
    assert summary["lost_updates"] == writes_landed - value_gained
    assert summary["lost_updates"] > 0, "think time between read and write must make blind writes collide"
    assert summary["final_value"] == row.value
    assert summary["invariant_ok"] is True
    # The writes that erased others say so: the versions they skipped over.
    assert any(event.detail.get("overwrote") for event in events(job, "committed"))


@pytest.mark.parametrize("strategy", ["occ", "pessimistic", "serializable", "atomic"])
def test_protected_strategy_loses_no_update_under_16_writers(strategy: str) -> None:
    job = run_counter(
        strategy=strategy, writers=16, increments=15, think_ms=1, retry="immediate", max_attempts=1000, seed=2
    )
    summary = job.summary
    (row,) = rows_of(job)
    assert job.status == "succeeded", job.error
    assert summary["committed"] == 16 * 15
    assert row.value == summary["initial_value"] + summary["committed"] == summary["final_value"]
    assert row.resource_version - 1 == summary["committed"]
    assert summary["lost_updates"] == 0
    assert summary["invariant_ok"] is True
    # The race really happened, each strategy showing it its own way.
    if strategy == "occ":
        assert summary["conflicts"] > 0
    elif strategy == "pessimistic":
        assert summary["lock_waits"] > 0
    elif strategy == "serializable":
        assert summary["serialization_failures"] > 0


def test_every_conflict_is_a_compare_and_swap_that_matched_zero_rows() -> None:
    job = run_counter(strategy="occ", writers=8, increments=20, think_ms=1, retry="immediate", max_attempts=1000)
    commits = events(job, "committed")
    conflicts = events(job, "conflict")
    assert conflicts, "8 writers with think time must conflict"
    written = [event.version_written for event in commits]
    # Versions written are exactly initial+1 .. final, once each: no two CASes won the same version.
    assert sorted(written) == list(range(2, 2 + len(commits)))
    assert all(event.version_written == event.version_read + 1 for event in commits)
    writer_of = {event.version_written: event.actor for event in commits}
    for conflict in conflicts:
        # The version it expected had already been replaced, by another writer's committed CAS.
        assert conflict.version_read + 1 in writer_of
        assert writer_of[conflict.version_read + 1] != conflict.actor
    assert job.summary["conflicts"] == len(conflicts)
    assert job.summary["attempts"] == len(commits) + len(conflicts)


def test_a_conflict_is_explained_with_the_409_the_api_server_would_answer() -> None:
    job = run_counter(strategy="occ", writers=4, increments=10, rows=2, think_ms=2, retry="immediate", seed=5)
    conflicts = events(job, "conflict")
    assert conflicts, "4 writers with think time on 2 rows must conflict"
    names = {row.pk: row.name for row in rows_of(job)}
    explain = SCENARIOS["counter"].kind("conflict").explain
    for conflict in conflicts:
        said = fill(explain, {"detail": conflict.detail}, "writer")
        assert said == f"409 Conflict: {conflict_message(Counter, names[conflict.row])}"
    assert {conflict.detail["name"] for conflict in conflicts} <= {"row-1", "row-2"}


@pytest.mark.parametrize("retry", ["k8s-default-retry", "k8s-default-backoff", "exponential"])
def test_retries_wait_within_the_policy_bounds(retry: str) -> None:
    max_attempts = 6
    job = run_counter(strategy="occ", writers=6, increments=8, think_ms=2, retry=retry, max_attempts=max_attempts)
    policy = make_policy(retry, max_attempts)
    retries = events(job, "retry")
    assert retries, "6 writers with think time must retry"
    reads = {(e.actor, e.op, e.attempt): e for e in events(job, "read")}
    for event in retries:
        low, high = policy.bounds_ms(event.attempt)
        assert low <= event.duration_ms <= high
        # The next attempt's read came no sooner than the wait.
        next_read = reads[(event.actor, event.op, event.attempt + 1)]
        assert next_read.t_ms - event.t_ms >= event.duration_ms - 0.5


def test_k8s_presets_are_client_go_defaults() -> None:
    backoff = make_policy("k8s-default-backoff")
    assert backoff.max_attempts == 4
    assert [backoff.bounds_ms(n) for n in (1, 2, 3)] == [(10.0, 11.0), (50.0, 55.00000000000001), (250.0, 275.0)]
    retry = make_policy("k8s-default-retry")
    assert retry.max_attempts == 5
    assert {retry.bounds_ms(n) for n in (1, 2, 3, 4)} == {(10.0, 11.0)}
    assert make_policy("exponential", base_ms=10, factor=2, cap_ms=50).bounds_ms(4) == (0.0, 50.0)


def test_a_writer_that_runs_out_of_attempts_gives_up_and_says_so() -> None:
    job = run_counter(strategy="occ", writers=8, increments=10, think_ms=3, retry="immediate", max_attempts=2)
    gave_up = events(job, "gave_up")
    assert gave_up
    conflicts_per_op: dict[tuple[int, int], int] = {}
    for event in events(job, "conflict"):
        conflicts_per_op[(event.actor, event.op)] = conflicts_per_op.get((event.actor, event.op), 0) + 1
    for event in gave_up:
        assert event.attempt == 2
        assert conflicts_per_op[(event.actor, event.op)] == 2
    assert job.summary["gave_up"] == len(gave_up)
    assert job.summary["committed"] + job.summary["gave_up"] == 8 * 10
    assert job.summary["invariant_ok"] is True


def test_serialization_failures_are_retried_until_they_commit() -> None:
    job = run_counter(
        strategy="serializable", writers=8, increments=10, think_ms=2, retry="immediate", max_attempts=1000
    )
    failures = events(job, "serialization_failure")
    assert failures
    assert all("could not serialize access" in event.detail["message"] for event in failures)
    retried_commits = [event for event in events(job, "committed") if event.attempt > 1]
    assert retried_commits
    assert job.summary["committed"] == 80
    assert job.summary["invariant_ok"] is True


def test_repeatable_read_also_reports_serialization_failures() -> None:
    job = run_counter(
        strategy="serializable", isolation="repeatable-read", writers=6, increments=8, think_ms=2, max_attempts=1000
    )
    assert job.summary["serialization_failures"] > 0
    assert job.summary["invariant_ok"] is True


def test_lock_waits_are_measured() -> None:
    think_ms = 5.0
    job = run_counter(strategy="pessimistic", writers=4, increments=10, think_ms=think_ms)
    waits = events(job, "lock_wait")
    assert waits
    # A writer queued behind a holder that thinks for 5 ms waits at least that long, at least once.
    assert max(event.duration_ms for event in waits) >= think_ms
    assert job.summary["lock_wait_ms"] == pytest.approx(sum(event.duration_ms for event in waits), abs=0.01)
    assert job.summary["conflicts"] == 0


def test_atomic_increment_needs_no_read() -> None:
    job = run_counter(strategy="atomic", writers=8, increments=20)
    assert not Event.objects.filter(job=job, kind="read").exists()
    assert job.summary["committed"] == 160 == job.summary["final_value"]


def test_several_rows_spread_the_contention() -> None:
    job = run_counter(strategy="occ", writers=8, increments=20, rows=4, max_attempts=1000, retry="immediate")
    rows = rows_of(job)
    assert len(rows) == 4
    assert sum(row.value for row in rows) == 160 == job.summary["final_value"]
    assert all(row.value > 0 for row in rows)


def test_latency_percentiles_are_ordered() -> None:
    job = run_counter(strategy="occ", writers=4, increments=25, think_ms=1)
    latency = job.summary["latency_ms"]
    assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"]
    assert job.summary["commits_per_s"] > 0
