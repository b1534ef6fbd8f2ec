"""A job's stored events over HTTP: events.json paging, the exports, summary.json, replay and compare."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from occviz.jobs.models import Event, Job
from tests.helpers import run_counter

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def race(alice: User) -> Job:
    # Think time between read and write makes the writers collide: conflicts and retries happen.
    job = run_counter(
        user=alice, strategy="occ", writers=4, increments=15, think_ms=1, retry="immediate", max_attempts=50
    )
    assert job.status == "succeeded"
    return job


def stored_seqs(job: Job) -> list[int]:
    return list(Event.objects.filter(job=job).order_by("seq").values_list("seq", flat=True))


def test_events_json_pages_through_every_event_once_in_order(signed_in: Client, race: Job) -> None:
    seen: list[dict[str, Any]] = []
    after = 0
    pages = 0
    while True:
        page = signed_in.get(f"/jobs/{race.pk}/events.json?after={after}&limit=7").json()
        pages += 1
        assert page["job"] == race.pk
        assert page["after"] == after
        assert len(page["events"]) <= 7
        seen.extend(page["events"])
        after = page["next_after"]
        if not page["more"]:
            break
    assert [e["seq"] for e in seen] == stored_seqs(race) == list(range(1, race.last_seq + 1))
    assert pages == -(-race.last_seq // 7) + (race.last_seq % 7 == 0)
    assert page["status"] == "succeeded"
    assert page["last_seq"] == race.last_seq
    kinds = {e["kind"] for e in seen}
    assert {"read", "committed", "conflict", "retry"} <= kinds
    committed = next(e for e in seen if e["kind"] == "committed")
    assert set(committed) == {
        "seq", "t_ms", "actor", "op", "attempt", "kind", "row", "version_read", "version_written",
        "value_read", "value_written", "duration_ms", "latency_ms", "detail",
    }  # fmt: skip
    assert committed["version_written"] == committed["version_read"] + 1


def test_events_json_after_the_end_is_empty(signed_in: Client, race: Job) -> None:
    page = signed_in.get(f"/jobs/{race.pk}/events.json?after={race.last_seq}").json()
    assert page["events"] == []
    assert page["more"] is False
    assert page["next_after"] == race.last_seq


@pytest.mark.parametrize("query", ["after=-1", "after=x", "limit=0", "limit=100000", "limit=2.5"])
def test_events_json_refuses_bad_paging(signed_in: Client, race: Job, query: str) -> None:
    response = signed_in.get(f"/jobs/{race.pk}/events.json?{query}")
    assert response.status_code == 400
    assert "error" in response.json()


def test_events_json_of_a_missing_job_is_404(signed_in: Client) -> None:
    assert signed_in.get("/jobs/999999/events.json").status_code == 404


def test_jsonl_export_has_every_event_in_seq_order(signed_in: Client, race: Job) -> None:
    response = signed_in.get(f"/jobs/{race.pk}/export.jsonl")
    assert response.status_code == 200
    assert response.streaming
    assert response["Content-Type"].startswith("application/jsonl")
    assert f"occviz-job-{race.pk}-events.jsonl" in response["Content-Disposition"]
    lines = b"".join(response.streaming_content).decode().splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["seq"] for e in events] == stored_seqs(race)
    stored = Event.objects.get(job=race, seq=events[-1]["seq"])
    assert events[-1]["kind"] == stored.kind
    assert events[-1]["t_ms"] == stored.t_ms


def test_csv_export_has_a_header_and_every_event_in_seq_order(signed_in: Client, race: Job) -> None:
    response = signed_in.get(f"/jobs/{race.pk}/export.csv")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [int(r["seq"]) for r in rows] == stored_seqs(race)
    assert all(isinstance(json.loads(r["detail"]), dict) for r in rows)
    committed = next(r for r in rows if r["kind"] == "committed")
    stored = Event.objects.get(job=race, seq=int(committed["seq"]))
    assert (int(committed["version_read"]), int(committed["version_written"])) == (
        stored.version_read,
        stored.version_written,
    )


def test_exports_page_through_jobs_larger_than_one_page(
    signed_in: Client, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    from occviz.jobs import events

    monkeypatch.setattr(events, "EXPORT_PAGE", 10)  # a few dozen events: several pages
    job = run_counter(user=alice, strategy="atomic", writers=2, increments=20)
    lines = b"".join(signed_in.get(f"/jobs/{job.pk}/export.jsonl").streaming_content).decode().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == list(range(1, job.last_seq + 1))
    assert job.last_seq == 40


def test_unknown_export_format_is_404(signed_in: Client, race: Job) -> None:
    assert signed_in.get(f"/jobs/{race.pk}/export.xml").status_code == 404


def test_summary_json(signed_in: Client, race: Job) -> None:
    body = signed_in.get(f"/jobs/{race.pk}/summary.json").json()
    assert body["id"] == race.pk
    assert body["status"] == "succeeded"
    assert body["invariant_ok"] is True
    assert body["summary"]["committed"] == 60
    assert body["summary"]["lost_updates"] == 0
    assert body["params"]["writers"] == 4


def test_a_lost_update_race_reports_its_losses_on_the_job_page(signed_in: Client, alice: User) -> None:
    job = run_counter(user=alice, strategy="none", writers=6, increments=10, think_ms=3)
    assert job.summary is not None
    assert job.summary["lost_updates"] > 0
    html = signed_in.get(f"/jobs/{job.pk}/").content.decode()
    # Said first and not as a success: updates were lost; the invariant (they were counted exactly) holds.
    assert "verdict-ok" not in html
    assert f"⚠ {job.summary['lost_updates']} lost updates</strong>" in html
    assert "Invariant holds: " in html and f"{job.summary['lost_updates']} updates lost, counted exactly" in html
    # Shown in red: the class is only there when updates were lost.
    assert f'<dd data-counter="lost_updates" class="bad">{job.summary["lost_updates"]}</dd>' in html


def test_job_page_first_render_has_the_final_counters_and_rows(signed_in: Client, race: Job) -> None:
    html = signed_in.get(f"/jobs/{race.pk}/").content.decode()
    assert '<dd data-counter="committed">60</dd>' in html
    assert "<td>v61</td>" in html  # the one hot row, 60 increments after version 1
    assert 'class="event-' in html


def test_replay_page(signed_in: Client, race: Job) -> None:
    html = signed_in.get(f"/jobs/{race.pk}/replay/").content.decode()
    assert 'data-page="replay"' in html
    assert "data-scrub" in html
    assert 'value="0.01"' in html and 'value="10"' in html
    assert f'data-events-url="/jobs/{race.pk}/events.json"' in html


def test_compare_puts_jobs_side_by_side_on_one_scale(signed_in: Client, alice: User, race: Job) -> None:
    other = run_counter(user=alice, strategy="pessimistic", writers=4, increments=15, think_ms=1)
    response = signed_in.get(f"/jobs/compare/?ids={race.pk},{other.pk}")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count("data-compare-chart=") == 2
    series = response.context["series"]
    assert series["bin_ms"] == 100
    assert [j["id"] for j in series["jobs"]] == [race.pk, other.pk]
    assert sum(series["jobs"][0]["rates"]["committed"]) == 60
    assert sum(series["jobs"][1]["rates"]["committed"]) == 60
    assert sum(series["jobs"][0]["rates"]["conflict"]) == race.summary["conflicts"]  # type: ignore[index]
    # the same length: one time axis for both
    assert len(series["jobs"][0]["rates"]["committed"]) == len(series["jobs"][1]["rates"]["committed"])
    ticked = signed_in.get(f"/jobs/compare/?id={race.pk}&id={other.pk}")
    assert ticked.status_code == 200


def test_compare_needs_two_jobs(signed_in: Client, race: Job) -> None:
    assert signed_in.get(f"/jobs/compare/?ids={race.pk}").status_code == 400
    assert signed_in.get("/jobs/compare/?ids=a,b").status_code == 400
    assert signed_in.get(f"/jobs/compare/?ids={race.pk},999999").status_code == 404
    assert signed_in.get("/jobs/compare/").status_code == 200
