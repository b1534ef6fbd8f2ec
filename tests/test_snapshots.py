"""One truth for what a job shows: the snapshot its runner stored with each batch.

The live page, replay (`fragments/?seq=N`), `snapshot.json` and the summary all read the
same stored snapshots, so they say the same numbers; jobs run through the real runner on
real PostgreSQL, a leader election's replicas included, whose state lives only in the
runner's memory.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from typing import Any

import pytest
from django.db import connections
from django.test import Client

from occviz.jobs.models import EventBatch, Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.scenarios import SCENARIOS
from tests.helpers import events
from tests.test_outside_writes import OutsideIncrementer

pytestmark = pytest.mark.django_db(transaction=True)

FINISHED_JOBS = {
    "counter": {"strategy": "occ", "writers": 3, "increments": 40, "think_ms": 1},
    "leader-election": {"replicas": 3, "lease_duration": 1.0, "renew_deadline": 0.6, "retry_period": 0.2, "seconds": 2},
    "quota": {"pods": 6, "hard": 3, "create_failure_rate": 0.3, "resync_seconds": 1, "seed": 4},
    "controllers": {"strategy": "occ", "controllers": 2, "seconds": 1.0},
    "step": {"script": "deadlock", "pace": "written order"},
    "anomalies": {"anomalies": "P4 G1a", "levels": "read-committed"},
}


def snapshot(client: Client, job: Job, seq: int | None = None) -> dict[str, Any]:
    response = client.get(f"/jobs/{job.pk}/snapshot.json" + ("" if seq is None else f"?seq={seq}"))
    assert response.status_code == 200, response.content
    return response.json()


def shown_figures(html: str) -> dict[str, str]:
    """The figures panel as a person reads it: each figure's key and text."""
    return {key: value.strip() for key, value in re.findall(r'data-counter="([^"]+)"[^>]*>(.*?)</dd>', html)}


@pytest.mark.parametrize("scenario", FINISHED_JOBS)
def test_live_replay_and_snapshot_json_show_the_same_figures_at_the_end(
    scenario: str, signed_in: Client, alice: Any
) -> None:
    job = run_job(create_job(scenario, FINISHED_JOBS[scenario], alice).pk)
    assert job.status == Job.Status.SUCCEEDED, job.error
    last = snapshot(signed_in, job)
    assert last["seq"] == job.last_seq > 0
    assert last == snapshot(signed_in, job, job.last_seq)
    assert last["figures"]["events"] == job.last_seq

    # The live page's first render, and replay at the last event, render that snapshot.
    page = signed_in.get(f"/jobs/{job.pk}/").content.decode()
    replayed = signed_in.get(f"/jobs/{job.pk}/fragments/?seq={job.last_seq}").content.decode()
    spec = SCENARIOS[scenario]
    assert shown_figures(page) == shown_figures(replayed)
    for figure in spec.shown_figures():
        value = last["figures"][figure.key]
        if value is not None and not figure.percentiles:
            assert shown_figures(page)[figure.key] == str(value), figure.key
    # The summary's figures are the final snapshot's (the scenario adds only its invariant).
    summary = job.summary or {}
    for figure in spec.figures:
        if figure.key in summary and (figure.count or figure.percentiles):
            assert summary[figure.key] == last["figures"][figure.key], figure.key


def test_snapshots_count_on_as_the_job_goes_and_refuse_a_bad_seq(signed_in: Client, alice: Any) -> None:
    job = run_job(create_job("counter", FINISHED_JOBS["counter"], alice).pk)
    batches = list(EventBatch.objects.filter(job=job).order_by("seq_to").values_list("seq_to", flat=True))
    assert len(batches) >= 2, "one batch only: nothing to see move"
    seen = [snapshot(signed_in, job, seq) for seq in (0, 1, batches[0], batches[len(batches) // 2], job.last_seq)]
    assert seen[0] == seen[1] == {"seq": 0, "t_ms": 0.0, "figures": {}, "state": {}}  # before the first batch
    assert seen[2]["seq"] == batches[0] and seen[-1]["seq"] == job.last_seq
    for earlier, later in itertools.pairwise(seen[2:]):
        assert earlier["seq"] <= later["seq"] and earlier["t_ms"] <= later["t_ms"]
        for key in ("events", "attempts", "committed", "conflicts"):
            assert earlier["figures"][key] <= later["figures"][key], key
    # The rows at the end hold every commit.
    assert seen[-1]["state"]["rows"][0]["value"] == seen[-1]["figures"]["committed"]

    for bad, why in (
        ("-1", "whole number"),
        ("abc", "whole number"),
        ("\u0663", "whole number"),
        (str(job.last_seq + 1), "beyond the job's last event"),
    ):
        for url in (f"/jobs/{job.pk}/snapshot.json?seq={bad}", f"/jobs/{job.pk}/fragments/?seq={bad}"):
            response = signed_in.get(url)
            assert response.status_code == 400, url
            assert why in response.content.decode(), url


def test_a_running_leader_elections_replicas_show_from_the_first_render(signed_in: Client, alice: Any) -> None:
    params = {"replicas": 3, "lease_duration": 2.0, "renew_deadline": 1.2, "retry_period": 0.3, "seconds": 30}
    job = create_job("leader-election", params, alice)

    def run() -> None:
        try:
            run_job(job.pk)
        finally:
            connections.close_all()

    runner = threading.Thread(target=run)
    runner.start()
    try:
        deadline = time.monotonic() + 20
        while True:
            job.refresh_from_db()
            state = snapshot(signed_in, job)["state"] if job.last_seq else {}
            if any(replica["leading"] for replica in state.get("replicas", [])):
                break
            assert time.monotonic() < deadline, "no replica led within 20 s"
            time.sleep(0.1)
        # What the web process shows, it read from the runner's snapshot: beliefs, tokens, timers.
        assert [replica["name"] for replica in state["replicas"]] == ["replica-1", "replica-2", "replica-3"]
        leader = next(replica for replica in state["replicas"] if replica["leading"])
        assert leader["token"] >= 1
        assert any(replica["timer_s"] is not None for replica in state["replicas"])
        page = signed_in.get(f"/jobs/{job.pk}/").content.decode()
        assert re.search(r"<strong>yes</strong> \(token \d+\)", page), "the page does not show who leads"
        assert "s left" in page  # a follower's lease timer
        replayed = signed_in.get(f"/jobs/{job.pk}/fragments/?seq={job.last_seq}").content.decode()
        assert re.search(r"<strong>yes</strong> \(token \d+\)", replayed)
    finally:
        job.request_cancel()
        runner.join(timeout=30)


def test_an_api_increment_a_later_commit_builds_on_is_no_lost_update_live_in_replay_or_summary(
    signed_in: Client, alice: Any
) -> None:
    params = {"strategy": "occ", "writers": 3, "increments": 150, "think_ms": 3, "max_attempts": 50}
    job = create_job("counter", params, alice)
    outside = OutsideIncrementer(job.pk, increments=20, think_s=0.003)
    outside.start()
    job = run_job(job.pk)
    outside.join(timeout=60)
    assert outside.error is None, outside.error
    assert outside.committed == 20 and outside.conflicts > 0, "the API writer never raced the job"
    # Commits of the job's writers came after the API's and built on them: they read the versions it wrote.
    written_outside = {event.version_written for event in events(job, "outside_write")}
    assert any(event.version_read in written_outside for event in events(job, "committed"))
    summary = job.summary or {}
    assert summary["outside_writes"] == 20 and summary["lost_updates"] == 0, summary["invariant"]

    last = snapshot(signed_in, job)
    assert last["figures"]["lost_updates"] == 0 and last["figures"]["outside_writes"] == 20
    assert last["state"]["rows"][0]["value"] == summary["final_value"] == summary["committed"] + 20
    for url in (f"/jobs/{job.pk}/", f"/jobs/{job.pk}/fragments/?seq={job.last_seq}"):
        shown = shown_figures(signed_in.get(url).content.decode())
        assert shown["lost_updates"] == "0" and shown["outside_writes"] == "20", url
