"""A classroom's needs outside the browser: presets set by time, the counter race's duration, the home page's
"mine / all" filter, and running a job again (presenter mode's `r`)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from occviz.jobs.models import Job
from occviz.jobs.registry import ParamsError
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.scenarios import SCENARIOS

COUNTER = SCENARIOS["counter"]


@pytest.mark.parametrize(
    ("scenario", "slug"), [(spec.name, preset.slug) for spec in SCENARIOS.values() for preset in spec.presets]
)
def test_every_preset_runs_5_to_20_seconds_and_ends_by_itself(scenario: str, slug: str) -> None:
    spec = SCENARIOS[scenario]
    params = spec.clean(next(p for p in spec.presets if p.slug == slug).params)
    if scenario == "step":
        assert params["pace"] == "by hand", params  # the teacher paces a script, step by step
    elif scenario == "anomalies":
        assert "seconds" not in params  # a fixed suite of scripts, each to its end
    else:
        assert 5 <= params["seconds"] <= 20, params  # a sweep's: each point's
        assert params.get("increments") is None  # set by time, not by a count that a fast machine finishes at once


@pytest.mark.parametrize(
    ("seconds", "why"),
    [
        ("0.01", "greater than or equal to 0.1"),
        ("301", "At most 300 seconds"),
        ("soon", "Enter a number"),
        ("٣", "digits 0-9"),
        ("nan", "Enter a number"),
    ],
)
def test_the_counter_race_duration_is_bounded(seconds: str, why: str) -> None:
    with pytest.raises(ParamsError) as refused:
        COUNTER.clean({"strategy": "occ", "seconds": seconds})
    assert why in " ".join(refused.value.errors["seconds"])


def test_the_counter_race_takes_a_duration_or_a_count_not_both() -> None:
    with pytest.raises(ParamsError) as refused:
        COUNTER.clean({"strategy": "occ", "seconds": 5, "increments": 10})
    assert refused.value.errors["seconds"] == ["Give increments or seconds, not both."]
    assert COUNTER.clean({"strategy": "occ", "seconds": 5})["increments"] is None


def test_a_bad_duration_in_the_launch_form_says_why_and_launches_nothing(signed_in: Client) -> None:
    response = signed_in.post("/jobs/new/counter/", {"strategy": "occ", "writers": "2", "seconds": "0"})
    assert response.status_code == 400
    assert "greater than or equal to 0.1" in response.content.decode()
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_counter_race_run_for_a_time_ends_then_with_an_exact_verdict() -> None:
    job = run_job(create_job("counter", {"strategy": "none", "writers": 3, "seconds": 0.5, "think_ms": 1}).pk)
    summary = job.summary or {}
    assert job.status == Job.Status.SUCCEEDED
    assert 0.4 <= summary["duration_s"] < 2
    assert summary["invariant_ok"] is True  # the blind writes' losses counted exactly, whenever the time ran out
    assert summary["committed"] > 0


def _job(user: User | None, status: str = "succeeded") -> Job:
    return Job.objects.create(
        scenario="counter", params={"strategy": "occ", "writers": 2}, status=status, created_by=user
    )


def test_home_lists_my_jobs_by_default_and_everyone_s_on_all(signed_in: Client, alice: User) -> None:
    mine, running = _job(alice), _job(alice, "running")
    bench = _job(None)  # a benchmark's job: launched by no one
    bob = _job(User.objects.create_user("bob"))
    html = signed_in.get("/").content.decode()
    for job in (mine, running):
        assert f'href="/jobs/{job.pk}/"' in html
    for job in (bench, bob):
        assert f'href="/jobs/{job.pk}/"' not in html
    assert 'hx-get="/?jobs=mine"' in html, "the list refreshes itself with the same filter"
    everyone = signed_in.get("/?jobs=all").content.decode()
    for job in (mine, running, bench, bob):
        assert f'href="/jobs/{job.pk}/"' in everyone
    assert 'hx-get="/?jobs=all"' in everyone
    partial = signed_in.get("/?jobs=all", headers={"HX-Request": "true"}).content.decode()
    assert f'href="/jobs/{bench.pk}/"' in partial


def test_home_takes_an_unknown_filter_as_mine(signed_in: Client, alice: User) -> None:
    bench = _job(None)
    response = signed_in.get("/?jobs=<script>")
    assert response.status_code == 200
    html = response.content.decode()
    assert f'href="/jobs/{bench.pk}/"' not in html
    assert "<script>" not in html.split('id="jobs"')[1].split("</section>")[0]


def test_run_again_launches_the_same_parameters_as_a_new_job(signed_in: Client, alice: User) -> None:
    params = {"replicas": 2, "lease_duration": 1.5, "renew_deadline": 1.0, "retry_period": 0.25, "seconds": 2}
    bob = User.objects.create_user("bob")
    first = create_job("leader-election", params, bob)
    response = signed_in.post(f"/jobs/{first.pk}/again/", {"present": "1"})
    again = Job.objects.exclude(pk=first.pk).get()
    assert response.status_code == 302
    assert response["Location"] == f"/jobs/{again.pk}/?present=1"
    assert (again.scenario, again.params, again.status, again.created_by) == (
        "leader-election",
        first.params,
        "queued",
        alice,
    )
    assert signed_in.get(f"/jobs/{first.pk}/again/").status_code == 405
    assert signed_in.post("/jobs/999999/again/").status_code == 404


def test_run_again_refused_says_why_and_launches_nothing(signed_in: Client, alice: User, settings) -> None:  # type: ignore[no-untyped-def]
    first = create_job("counter", {"strategy": "occ", "writers": 2, "seconds": 1}, alice)
    settings.OCCVIZ_MAX_JOBS_PER_USER = 1  # the first is still queued
    response = signed_in.post(f"/jobs/{first.pk}/again/")
    assert response.status_code == 409
    assert response.content.decode().startswith("Not run again: ")
    assert Job.objects.count() == 1
