"""The contention curve (the sweep scenario): counter races and pgbench at 1, 2, 4, ... writers, each point a job."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from django.db import connections
from django.test import Client

from occviz.jobs.models import Event, Job
from occviz.jobs.registry import ParamsError
from occviz.jobs.runner import run_job
from occviz.jobs.snapshots import snapshot_or_empty
from occviz.jobs.tasks import RUNNER_CONNECTIONS, create_job
from occviz.pgbench import run_pgbench
from occviz.scenarios.sweep import scenario
from occviz.scenarios.sweep.plan import levels
from occviz.store.models import Counter

pytestmark = pytest.mark.django_db(transaction=True)

POINT_KEYS = {"strategy", "writers", "commits_per_s", "conflicts_per_s", "conflict_rate", "committed", "attempts"}


def run_in_thread(job: Job) -> threading.Thread:
    def run() -> None:
        try:
            run_job(job.pk)
        finally:
            connections.close_all()

    runner = threading.Thread(target=run)
    runner.start()
    return runner


def wait_for(found: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := found()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.05)
    return value


def test_the_levels_double_up_to_the_largest_which_ends_them() -> None:
    assert levels(1) == [1]
    assert levels(8) == [1, 2, 4, 8]
    assert levels(64) == [1, 2, 4, 8, 16, 32, 64]
    assert levels(48) == [1, 2, 4, 8, 16, 32, 48]


def test_strategies_are_words_checked_against_the_counter_race_s() -> None:
    params = scenario.clean({"strategies": "occ, atomic occ", "max_writers": 8, "seconds": 1})
    assert params["strategies"] == "occ atomic"
    # As the API's JSON gives them, a list.
    listed = scenario.clean({"strategies": ["atomic", "occ"], "max_writers": 8, "seconds": 1})
    assert listed["strategies"] == "atomic occ"
    assert scenario.actor_names(params) == ["occ", "atomic", "pgbench"]
    assert scenario.actor_names({**params, "pgbench": "off"}) == ["occ", "atomic"]
    # The largest part: the counter race (or pgbench) at 8 writers, with its own runner's connections.
    assert scenario.connections(params) == 8 + RUNNER_CONNECTIONS


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--strategies", "occ", "--max-writers", "0"],
            "--max-writers: Ensure this value is greater than or equal to 1.",
        ),
        (
            ["--strategies", "occ", "--max-writers", "65"],
            "--max-writers: Ensure this value is less than or equal to 64.",
        ),
        (["--strategies", "occ", "optimistic"], "--strategies: unknown strategy 'optimistic'"),
        (["--strategies", "occ", "--seconds", "0"], "--seconds: Ensure this value is greater than or equal to 1"),
        (["--strategies", "occ", "--pgbench", "maybe"], "invalid choice: 'maybe'"),
        (
            ["--strategies", "occ", "atomic", "--max-writers", "64", "--seconds", "20"],
            "--seconds: 7 levels x 3 series x 20 s is 420 s, more than the 300 s a job may run",
        ),
    ],
)
def test_bad_flags_get_a_clear_error_and_create_no_job(run_manage: Any, flags: list[str], message: str) -> None:
    result = run_manage("runjob", "sweep", *flags, "--json")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert result.stdout == ""
    assert not Job.objects.exists()


def test_the_length_of_a_sweep_is_bounded_by_the_job_time_limit(settings: Any) -> None:
    settings.OCCVIZ_MAX_SECONDS = 20
    # 4 levels x (1 strategy and pgbench) x 3 s = 24 s; without pgbench 12 s.
    with pytest.raises(ParamsError) as refused:
        scenario.clean({"strategies": "occ", "max_writers": 8, "seconds": 3})
    assert "4 levels x 2 series x 3 s is 24 s, more than the 20 s" in " ".join(refused.value.errors["seconds"])
    assert scenario.clean({"strategies": "occ", "max_writers": 8, "seconds": 3, "pgbench": "off"})


@pytest.mark.slow
def test_runjob_sweeps_two_strategies_and_pgbench_over_1_to_8_writers(run_manage: Any, signed_in: Client) -> None:
    result = run_manage(
        "runjob", "sweep", "--strategies", "occ", "atomic", "--max-writers", "8", "--seconds", "1", "--json"
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["invariant_ok"] is True, summary["invariant"]
    assert summary["invariant"] == "12 of 12 points measured; every counter race's invariant holds"
    points = summary["points"]
    # Level by level, so the curve grows left to right; at each level the strategies, then pgbench.
    assert [(p["strategy"], p["writers"]) for p in points] == [
        (name, writers) for writers in (1, 2, 4, 8) for name in ("occ", "atomic", "pgbench")
    ]
    assert all(p.keys() >= POINT_KEYS for p in points)
    sweep = Job.objects.get(pk=summary["id"])
    assert sweep.status == Job.Status.SUCCEEDED

    for point in [p for p in points if p["strategy"] != "pgbench"]:
        part = Job.objects.get(pk=point["job"])
        assert part.parent_id == sweep.pk and part.scenario == "counter"
        assert (part.params["strategy"], part.params["writers"]) == (point["strategy"], point["writers"])
        assert point["commits_per_s"] == part.summary["commits_per_s"] > 0
        assert (point["committed"], point["attempts"]) == (part.summary["committed"], part.summary["attempts"])
        assert part.summary["invariant_ok"] is True
    assert Job.objects.filter(parent=sweep).count() == 8
    # An in-place increment never conflicts; with 8 writers on one row, compare-and-swap does.
    assert all(p["conflicts_per_s"] == 0 for p in points if p["strategy"] == "atomic")
    assert next(p for p in points if p["strategy"] == "occ" and p["writers"] == 8)["conflict_rate"] > 0

    pgbench = [p for p in points if p["strategy"] == "pgbench"]
    assert all(p["committed"] > 0 and p["commits_per_s"] > 0 and "job" not in p for p in pgbench)
    # pgbench's commits are the compare-and-swaps that moved the sweep's own row.
    row = Counter.objects.get(job=sweep, name="pgbench")
    assert row.resource_version - 1 == row.value == sum(p["committed"] for p in pgbench)

    # Each point is an event, and the last snapshot's curve (what every viewer draws) holds them all.
    recorded = Event.objects.filter(job=sweep, kind="point").order_by("seq").values_list("detail", flat=True)
    assert [{**p, "seconds": 1} for p in points] == list(recorded)
    state = snapshot_or_empty(sweep.pk, sweep.last_seq)["state"]
    assert state["points"] == list(recorded) and state["running"] is None
    assert state["levels"] == [1, 2, 4, 8]
    assert [row["writers"] for row in state["rows"]] == [1, 2, 4, 8]

    page = signed_in.get(f"/jobs/{sweep.pk}/").content.decode()
    for point in points:
        if "job" in point:
            assert f'href="/jobs/{point["job"]}/" data-point-job="{point["job"]}"' in page
    assert page.count('data-state="measured"') == 12
    peak = max(points, key=lambda point: point["commits_per_s"])
    assert summary["peak_commits_per_s"] == round(peak["commits_per_s"])
    assert summary["peak_at"] == f"{peak['strategy']}, {peak['writers']} writer{'s' * (peak['writers'] != 1)}"
    assert f"{peak['strategy']} at {peak['writers']} writer" in page.split("data-sweep-peak", 1)[1][:400]
    assert 'id="sweep-curve"' in page and "data-sweep-chart" in page


def test_cancel_stops_the_point_running_and_ends_the_sweep() -> None:
    sweep = create_job("sweep", {"strategies": "occ atomic", "max_writers": 2, "seconds": 30})
    runner = run_in_thread(sweep)
    part = wait_for(lambda: Job.objects.filter(parent=sweep, status="running").first(), "the first point started")
    sweep.request_cancel()
    runner.join(15)
    assert not runner.is_alive(), "the cancelled sweep kept running"
    sweep.refresh_from_db()
    part.refresh_from_db()
    assert sweep.status == part.status == Job.Status.CANCELLED
    assert part.summary["duration_s"] < 15
    assert Job.objects.filter(parent=sweep).count() == 1, "no point begun after the cancel"
    assert sweep.summary["points"] == []
    assert sweep.summary["stopped_at"] == {"strategy": "occ", "writers": 1, "seconds": 30, "reason": "cancelled"}
    assert sweep.summary["invariant"].startswith("stopped (cancelled) at occ with 1 writer: 0 of 6 points measured")
    kinds = list(Event.objects.filter(job=sweep).order_by("seq").values_list("kind", flat=True))
    assert kinds == ["point_started", "point_stopped"]
    state = snapshot_or_empty(sweep.pk, sweep.last_seq)["state"]
    assert state["running"] is None and state["rows"][0]["cells"][0]["state"] == "stopped"


def test_a_stop_ends_pgbench_at_once() -> None:
    row = Counter.objects.create(namespace="sweep-test", name="hot")
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    run = run_pgbench(row.pk, 2, 30, stop=stop)
    assert time.monotonic() - started < 5
    assert run.stopped


def test_a_point_that_cannot_be_measured_is_named_and_breaks_the_invariant() -> None:
    # Someone deletes the sweep's pgbench row while it runs: pgbench fails, and the sweep says so.
    sweep = create_job("sweep", {"strategies": "atomic", "max_writers": 1, "seconds": 1})
    runner = run_in_thread(sweep)
    row = wait_for(lambda: Counter.objects.filter(job=sweep, name="pgbench").first(), "the sweep's pgbench row")
    Counter.objects.filter(pk=row.pk).delete()
    runner.join(30)
    sweep.refresh_from_db()
    assert sweep.status == Job.Status.SUCCEEDED
    assert sweep.invariant_ok is False
    [missing] = sweep.summary["missing"]
    assert (missing["strategy"], missing["writers"]) == ("pgbench", 1)
    assert missing["reason"] == f"counter row {row.pk} is gone (deleted): pgbench has no row to run on."
    assert f"pgbench at 1 writer missing: counter row {row.pk} is gone" in sweep.summary["invariant"]
    assert [p["strategy"] for p in sweep.summary["points"]] == ["atomic"]
    assert sweep.summary["points_missing"] == 1


@pytest.mark.slow
def test_a_cancel_after_some_points_keeps_them_and_begins_no_more() -> None:
    sweep = create_job("sweep", {"strategies": "atomic", "max_writers": 4, "seconds": 2})
    runner = run_in_thread(sweep)
    wait_for(lambda: Event.objects.filter(job=sweep, kind="point").count() >= 2, "two points measured")
    sweep.request_cancel()
    runner.join(15)
    assert not runner.is_alive(), "the cancelled sweep kept running"
    sweep.refresh_from_db()
    summary = sweep.summary or {}
    assert sweep.status == Job.Status.CANCELLED and summary["invariant_ok"] is True
    measured = [(p["strategy"], p["writers"]) for p in summary["points"]]
    plan = [("atomic", 1), ("pgbench", 1), ("atomic", 2), ("pgbench", 2), ("atomic", 4), ("pgbench", 4)]
    assert 2 <= len(measured) < len(plan) and measured == plan[: len(measured)]
    stopped = summary["stopped_at"]
    assert (stopped["strategy"], stopped["writers"]) == plan[len(measured)]
    assert summary["invariant"].startswith(f"stopped (cancelled) at {stopped['strategy']}")
    # Every part measured succeeded; the one running at the cancel (if a counter race) was cancelled; none after it.
    parts = list(Job.objects.filter(parent=sweep).order_by("pk").values_list("status", flat=True))
    counted = sum(1 for name, _ in plan[: len(measured) + 1] if name == "atomic")
    assert len(parts) == counted
    assert set(parts[: sum(1 for name, _ in measured if name == "atomic")]) <= {"succeeded"}
    state = snapshot_or_empty(sweep.pk, sweep.last_seq)["state"]
    assert len(state["points"]) == len(measured) and state["running"] is None
