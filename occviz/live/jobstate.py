"""A job's row as the live stream needs it (`JobState`): read once, then kept by its feed and viewers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from channels.db import database_sync_to_async

from occviz.jobs.events import EVENT_FIELDS
from occviz.jobs.models import Job
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
            "scenario": self.info.spec.vocabulary(self.info.params),
            "after": after,
        }

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
