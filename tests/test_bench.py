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
