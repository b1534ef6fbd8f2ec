"""Retention: old finished jobs' events are pruned; the jobs, their summaries and verdicts stay, and say so."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from occviz.jobs import retention
from occviz.jobs.models import Event, EventBatch, Job
from occviz.jobs.retention import prune_events
from tests.helpers import run_counter

pytestmark = pytest.mark.django_db(transaction=True)


def finished_days_ago(job: Job, days: float) -> Job:
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(days=days))
    job.refresh_from_db()
    return job


@pytest.fixture
def three_jobs(alice: User) -> dict[str, Job]:
    """A job finished 40 days ago, one finished yesterday, and one that has run 40 days and still runs."""
    old = finished_days_ago(run_counter(alice, strategy="occ", writers=2, seconds=0.3, think_ms=1), 40)
    recent = finished_days_ago(run_counter(alice, strategy="occ", writers=2, seconds=0.3, think_ms=1), 1)
    running = run_counter(alice, strategy="atomic", writers=2, increments=20)
    Job.objects.filter(pk=running.pk).update(
        status=Job.Status.RUNNING, started_at=timezone.now() - timedelta(days=40), finished_at=None
    )
    for job in (old, recent, running):
        assert EventBatch.objects.filter(job=job).exists()
    return {"old": old, "recent": recent, "running": running}


def test_prune_deletes_only_old_finished_jobs_events_and_keeps_the_jobs(three_jobs: dict[str, Job]) -> None:
    old, recent, running = three_jobs["old"], three_jobs["recent"], three_jobs["running"]
    events_before = {job.pk: Event.objects.filter(job=job).count() for job in (recent, running)}

    result = prune_events(30)

    assert result.jobs == [old.pk]
    assert result.events == old.last_seq > 0
    assert result.batches > 0
    assert not EventBatch.objects.filter(job=old).exists()
    pruned = Job.objects.get(pk=old.pk)
    assert pruned.events_pruned_at is not None
    assert pruned.summary == old.summary and pruned.summary["committed"] > 0
    assert (pruned.invariant_ok, pruned.last_seq, pruned.status) == (True, old.last_seq, old.status)
    assert {job.pk: Event.objects.filter(job=job).count() for job in (recent, running)} == events_before
    assert Job.objects.get(pk=recent.pk).events_pruned_at is None
    assert prune_events(30).jobs == [], "a pruned job is not pruned again"


def test_a_dry_run_says_what_it_would_prune_and_deletes_nothing(three_jobs: dict[str, Job]) -> None:
    old = three_jobs["old"]
    result = prune_events(30, dry_run=True)
    assert (result.jobs, result.events) == ([old.pk], old.last_seq)
    assert str(result).startswith("Would prune the events of 1 job finished before ")
    assert Event.objects.filter(job=old).count() == old.last_seq
    assert Job.objects.get(pk=old.pk).events_pruned_at is None


def test_keep_days_is_the_default_and_zero_keeps_everything(three_jobs: dict[str, Job], settings: Any) -> None:
    settings.OCCVIZ_KEEP_DAYS = 0
    assert prune_events().jobs == []
    assert str(prune_events()) == "Nothing pruned: events are kept for ever (OCCVIZ_KEEP_DAYS=0)."
    settings.OCCVIZ_KEEP_DAYS = 50
    assert prune_events().jobs == []
    settings.OCCVIZ_KEEP_DAYS = 30
    assert prune_events().jobs == [three_jobs["old"].pk]


def test_events_are_deleted_a_few_rows_a_transaction(three_jobs: dict[str, Job], monkeypatch: Any) -> None:
    old = three_jobs["old"]
    batches = EventBatch.objects.filter(job=old).count()
    assert batches > 2
    monkeypatch.setattr(retention, "DELETE_ROWS", 2)
    assert prune_events(30).batches == batches
    assert not EventBatch.objects.filter(job=old).exists()


def test_a_prune_that_was_interrupted_is_finished_by_the_next(three_jobs: dict[str, Job]) -> None:
    old = three_jobs["old"]
    # Marked, but its events still there: the process stopped between the mark and the deletes.
    Job.objects.filter(pk=old.pk).update(events_pruned_at=timezone.now())
    assert prune_events(30).jobs == [old.pk]
    assert not EventBatch.objects.filter(job=old).exists()


def test_the_prune_command(three_jobs: dict[str, Job]) -> None:
    out = io.StringIO()
    call_command("prune", "--days", "30", "--dry-run", stdout=out)
    assert "Would prune the events of 1 job" in out.getvalue()
    assert EventBatch.objects.filter(job=three_jobs["old"]).exists()
    out = io.StringIO()
    call_command("prune", "--days", "30", stdout=out)
    assert out.getvalue().startswith("Pruned the events of 1 job finished before ")
    assert f"Jobs: {three_jobs['old'].pk}" in out.getvalue()
    assert not EventBatch.objects.filter(job=three_jobs["old"]).exists()
    with pytest.raises(CommandError, match="invalid whole number of days value"):
        call_command("prune", "--days", "\u0663")


def test_a_pruned_jobs_page_says_so_and_keeps_its_summary_and_verdict(
    three_jobs: dict[str, Job], signed_in: Client
) -> None:
    old = three_jobs["old"]
    prune_events(30)
    html = signed_in.get(f"/jobs/{old.pk}/").content.decode()
    assert "data-pruned" in html
    assert f"This job's {old.last_seq} events were pruned</strong> on " in html
    assert "Its summary and verdict are kept." in html
    assert f"Invariant holds: {old.summary['invariant']}" in html
    assert f"<dt>committed</dt><dd>{old.summary['committed']}</dd>" in html
    recent = signed_in.get(f"/jobs/{three_jobs['recent'].pk}/").content.decode()
    assert "data-pruned" not in recent


def test_a_pruned_jobs_events_and_exports_answer_410_gone(three_jobs: dict[str, Job], signed_in: Client) -> None:
    old = three_jobs["old"]
    prune_events(30)
    response = signed_in.get(f"/jobs/{old.pk}/events.json?after=0")
    assert response.status_code == 410
    body = response.json()
    assert body["error"].startswith(f"The {old.last_seq} events of job {old.pk} were pruned on ")
    assert ", 40 days after the job finished. Its summary and verdict are kept" in body["error"]
    assert body["last_seq"] == old.last_seq and body["pruned_at"]
    for fmt in ("csv", "jsonl"):
        export = signed_in.get(f"/jobs/{old.pk}/export.{fmt}")
        assert export.status_code == 410
        assert export["Content-Type"].startswith("text/plain")
        assert export.content.decode() == body["error"]
    assert signed_in.get(f"/jobs/{old.pk}/summary.json").json()["summary"] == old.summary
    # A job not pruned still answers with its events.
    assert signed_in.get(f"/jobs/{three_jobs['recent'].pk}/events.json").json()["events"]
