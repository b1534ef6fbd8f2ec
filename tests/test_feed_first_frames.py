"""A job feed started for a page on a job that has begun: its first frames carry the page's fragments.

A step job stepped by hand stores its first events and then waits for the teacher; a page
opened while it was queued must still be sent the state those events made, not frames
without fragments that nothing follows until the next click.
"""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from occviz.jobs.models import Job
from occviz.jobs.runner import run_job
from occviz.live.feeds import subscribe, unsubscribe
from occviz.live.jobstate import aread_job_state
from tests.test_live_stream import counter_job, session_cookie, socket

__all__ = ["session_cookie"]  # the fixture, used here by name

pytestmark = [pytest.mark.django_db(transaction=True, databases=["default", "channels_postgres"]), pytest.mark.asyncio]


async def test_the_frames_a_feed_reads_on_starting_carry_the_fragments_of_its_first_page() -> None:
    job = await sync_to_async(lambda: counter_job(increments=5))()
    queued = await aread_job_state(job.pk)  # as the page's socket read it, the job still queued
    assert queued is not None and queued.last_seq == 0
    # The job runs and stores its events before the feed starts; seen as running, as during the job.
    await sync_to_async(run_job)(job.pk)
    await Job.objects.filter(pk=job.pk).aupdate(status="running")
    feed = await subscribe(queued, html=True)
    try:
        stored = (await Job.objects.aget(pk=job.pk)).last_seq
        assert feed.frames, "the stored events were read on starting"
        assert feed.frames[-1].seq_to == stored
        html = feed.frames[-1].html
        assert html is not None and 'id="live-state"' in html["state"]
    finally:
        await unsubscribe(feed, html=True)


async def test_a_page_socket_opened_on_a_job_that_waits_is_sent_its_fragments_at_once(session_cookie: bytes) -> None:
    """The events were stored before the page's socket opened, and no more come: its first frame has the fragments."""
    job = await sync_to_async(lambda: run_job(counter_job(increments=5).pk))()
    await Job.objects.filter(pk=job.pk).aupdate(status="running")
    communicator = socket(f"/ws/jobs/{job.pk}/events/?after=0&html=1", session_cookie)
    assert (await communicator.connect())[0]
    try:
        assert (await communicator.receive_json_from(10))["type"] == "hello"
        frame = await communicator.receive_json_from(10)
        assert frame["type"] == "frame" and frame["seq_to"] == job.last_seq
        assert 'id="live-state"' in frame["html"] and 'id="live-figures"' in frame["html"]
    finally:
        await communicator.disconnect()
