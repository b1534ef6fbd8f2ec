"""A job's row as the live stream needs it (`JobState`): read once, then kept by its feed and viewers.

A class opens the same job all at once: `read_for_new_socket` reads its row once for every
socket of this process that asks while the read is under way, rather than once a socket (each
read waits its turn in the handshake threads, behind the other sockets' session loads).
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from channels.db import database_sync_to_async

from occviz.jobs.events import EVENT_FIELDS
from occviz.jobs.models import Job
from occviz.live.dbthreads import read_for_handshake
from occviz.live.frames import JobInfo


@dataclass
class JobState:
    """A job's row as the live stream needs it."""

    info: JobInfo
    status: str
    last_seq: int
    summary: dict[str, Any] | None
    invariant_ok: bool | None
    error: str = ""

    @property
    def finished(self) -> bool:
        return self.status in Job.FINISHED

    def hello(self, after: int) -> dict[str, Any]:
        return {
            "type": "hello",
            # frames send each event as an array of these values, in this order
            "event_fields": list(EVENT_FIELDS),
            "job": {
                "id": self.info.id,
                "scenario": self.info.scenario,
                "status": self.status,
                "params": self.info.params,
                "last_seq": self.last_seq,
            },
            # how to draw and word this job's events: kinds, figures, actors, state keys
            "scenario": self.vocabulary,
            "after": after,
        }

    @cached_property
    def vocabulary(self) -> dict[str, Any]:
        """Built once for the sockets that share this state."""
        return self.info.spec.vocabulary(self.info.params)

    def as_context(self) -> dict[str, Any]:
        """The job as the live fragments' templates read it."""
        return {
            "id": self.info.id,
            "scenario": self.info.scenario,
            "status": self.status,
            "finished": self.finished,
            "summary": self.summary,
            "invariant_ok": self.invariant_ok,
            "alarms": self.info.spec.alarms(self.summary),
            "error": self.error,
        }

    def end(self) -> dict[str, Any]:
        return {"type": "end", "status": self.status, "summary": self.summary, "invariant_ok": self.invariant_ok}


def read_job_state(job_id: int) -> JobState | None:
    job = (
        Job.objects.filter(pk=job_id)
        .only("scenario", "params", "status", "last_seq", "summary", "invariant_ok", "error")
        .first()
    )
    return None if job is None else job_state(job)


def job_state(job: Job) -> JobState:
    return JobState(
        info=JobInfo(id=job.pk, scenario=job.scenario, params=dict(job.params)),
        status=job.status,
        last_seq=job.last_seq,
        summary=job.summary,
        invariant_ok=job.invariant_ok,
        error=job.error,
    )


aread_job_state = database_sync_to_async(read_job_state)


_reading: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, asyncio.Future[JobState | None]]] = (
    weakref.WeakKeyDictionary()
)


async def read_for_new_socket(job_id: int) -> JobState | None:
    """The job's row for a new socket, in the handshake threads, shared with the sockets that ask meanwhile.

    A read already under way when a socket asks may be a few milliseconds older than the socket: its
    viewer follows the job from there, and its feed reads the row afresh when it starts.
    """
    reading = _reading.setdefault(asyncio.get_running_loop(), {})
    future = reading.get(job_id)
    if future is None:
        future = reading[job_id] = asyncio.ensure_future(read_for_handshake(read_job_state, job_id))
        future.add_done_callback(lambda done: _read(reading, job_id, done))
    return await asyncio.shield(future)


def _read(reading: dict[int, asyncio.Future[JobState | None]], job_id: int, done: asyncio.Future[Any]) -> None:
    if reading.get(job_id) is done:
        del reading[job_id]
    if not done.cancelled():
        done.exception()  # retrieved here too: every socket that waited for it may have left
