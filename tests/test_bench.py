"""The streaming benchmark's clients: what counts as a viewer that saw the whole job."""

from __future__ import annotations

import pytest

from occviz.bench.streaming import JOB_PAGE_QUERY, Viewer, streaming_bench

WHOLE = [(1, 10, 0.0), (11, 25, 0.1)]
END_WITH_FRAGMENTS = {"type": "end", "status": "succeeded", "html": '<div id="live-status" hx-swap-oob="true">'}


def test_a_viewer_is_complete_with_every_event_once_then_the_end() -> None:
    assert Viewer(WHOLE, END_WITH_FRAGMENTS).complete(25, html=True)
    assert Viewer(WHOLE, {"type": "end"}).complete(25, html=False)
    assert not Viewer(WHOLE, None).complete(25, html=False), "no end"
    assert not Viewer(WHOLE, {"type": "end"}).complete(25, html=True), "the page's end carries its fragments"
    assert not Viewer([(1, 10, 0.0), (10, 25, 0.1)], END_WITH_FRAGMENTS).complete(25, html=True), "a duplicate"
    assert not Viewer([(1, 10, 0.0), (12, 25, 0.1)], END_WITH_FRAGMENTS).complete(25, html=True), "a gap"
    assert not Viewer(WHOLE, END_WITH_FRAGMENTS).complete(30, html=True), "short of the last event"


@pytest.mark.slow
def test_job_page_sockets_through_daphne_see_every_event_and_the_end_with_fragments(database_url: str) -> None:
    figures = streaming_bench(database_url, seconds=1, writers=2, viewers=3, rounds=1, query=JOB_PAGE_QUERY)
    assert figures["viewers_complete"] == "3 of 3 saw every event exactly once and the end with its fragments"
    assert figures["decoded_complete"] == "1 of 1 decoded runs had every event exactly once"
    assert figures["commits_per_s_alone"] > 0 and figures["commits_per_s_watched"] > 0
    assert figures["latency_ms"]["p95"] is not None
    assert figures["web_cpu_ms_per_1000_events"] > 0  # the web server did work while the job was watched


@pytest.mark.slow
def test_a_small_class_arrives_drops_and_reopens_and_every_page_sees_the_whole_job(database_url: str) -> None:
    from occviz.bench.classroom import class_arrival_bench

    figures = class_arrival_bench(database_url, sockets=6, reopen=4, seconds=4, writers=2)
    assert figures["status"] == "succeeded" and figures["refused_count"] == 0
    assert figures["complete"] == "6 of 6 saw every event once and the end"
    assert figures["hello_ms"]["within_target"].endswith(" of 10")  # 6 openings, 4 reopenings
    assert figures["latency_ms"]["p95"] is not None
    memory = figures["memory_mb"]
    assert 0 < memory["start_mb"] <= memory["peak_mb"] and memory["end_mb"] > 0


@pytest.mark.slow
def test_a_small_class_on_a_student_link_sees_every_event_and_every_press_is_counted(database_url: str) -> None:
    from occviz.bench.students import students_bench

    figures = students_bench(database_url, students=4, pressing=2, seconds=3, writers=2, rounds=1)
    assert figures["complete"] == "4 of 4 students saw every event exactly once and the end"
    assert figures["refused_count"] == 0, figures["refused"]
    (counted,) = figures["presses_counted"]
    assert counted.startswith("every press counted on its lane: "), counted
    assert not counted.startswith("every press counted on its lane: 0 acknowledged"), "no press landed"
    assert figures["commits_per_s_alone_runs"][0] > 0 and figures["commits_per_s_watched_runs"][0] > 0
    assert figures["latency_ms"]["p95"] is not None
    # The floor's round: as many presses as 2 a second fit in the job's 3 s less half a second, made by pgbench.
    assert figures["floor_presses_runs"] == [5]
    assert figures["floor_commits_per_s_runs"][0] > 0 and figures["floor_ratio"] is not None


def test_the_floors_bare_writers_over_two_processes_lose_no_update_and_report_their_writes(database_url: str) -> None:
    from occviz.bench.floor import floor_commits_per_s
    from occviz.store.models import Counter

    counter = Counter.objects.create(namespace="bench-test", name="floor")
    version_before = counter.resource_version
    rate = floor_commits_per_s(counter.pk, writers=3, seconds=1, processes=2)
    counter.refresh_from_db()
    assert counter.value > 0, "the writers wrote nothing"
    # Every write was a compare-and-swap of the value read + 1: each moved the version by one, none was lost.
    assert counter.resource_version - version_before == counter.value
    assert rate == counter.value  # over 1 s, and nothing wrote before the release
