"""Reading a job's stored events, as viewers see them: pages by sequence, streamed exports, rate series.

The live stream, the dashboard and the API all read events here. The store is the truth
the live stream resumes from, so every reader pages by `seq` (keyset, never OFFSET): a
page costs the same at event 10 as at event 10 million, and an export never holds a
whole job in memory. A job whose events were pruned (occviz/jobs/retention.py) has none
to read: `pruned_notice` says so instead.
"""

from __future__ import annotations

import csv
import json
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection
from django.db.models import Count, F
from django.db.models.functions import Floor

from occviz.jobs.models import Event, Job
from occviz.jobs.recorder import EVENT_COLUMNS

EVENT_FIELDS = ("seq", *EVENT_COLUMNS)
EXPORT_PAGE = 5_000
MAX_PAGE = 5_000


def event_from_row(row: Sequence[Any]) -> dict[str, Any]:
    """An event as viewers see it, from a stored row (EVENT_FIELDS order, detail as JSON text)."""
    event = dict(zip(EVENT_FIELDS, row, strict=True))
    detail = event["detail"]
    if isinstance(detail, str):
        # most kinds store no detail: skip the parser for them (a fresh dict each, never shared)
        event["detail"] = {} if detail == "{}" else json.loads(detail)
    return event


# The batches a page of events needs: those ending after `after`, up to the first that reaches
# `after + limit`. Found by the (job, seq_to) index in one probe, so only they are unnested.
_PAGE = (
    f"SELECT {', '.join(EVENT_FIELDS)} FROM jobs_event "
    "WHERE job_id = %(job)s AND seq > %(after)s AND batch_seq_to > %(after)s AND batch_seq_to <= coalesce("
    "(SELECT seq_to FROM jobs_eventbatch WHERE job_id = %(job)s AND seq_to >= %(reach)s ORDER BY seq_to LIMIT 1), "
    "%(reach)s) ORDER BY seq LIMIT %(limit)s"
)
_READ_EVENTS = _PAGE
_MAX_SEQ = 2**63 - 1
_FLOAT_FIELDS = ("t_ms", "duration_ms", "latency_ms")


def _json_sql(field: str) -> str:
    """SQL for one field of an event as Python's json.dumps writes it (a float keeps its `.0`)."""
    if field == "kind":
        return "to_json(kind)::text"
    if field == "detail":
        return "detail::text"
    if field in _FLOAT_FIELDS:
        return f"CASE WHEN {field}::text ~ '[.en]' THEN {field}::text ELSE {field}::text || '.0' END"
    return f"{field}::text"


# The same page, each event as the JSON array the stream sends (EVENT_FIELDS order), joined by commas.
_READ_EVENTS_JSON = (
    "SELECT min(seq), max(seq), count(*), string_agg('[' || "
    + " || ',' || ".join(f"coalesce({_json_sql(field)}, 'null')" for field in EVENT_FIELDS)
    + f" || ']', ',' ORDER BY seq) FROM ({_PAGE}) AS page"
)


def _page_params(job_id: int, after: int, limit: int) -> dict[str, int]:
    return {"job": job_id, "after": after, "reach": min(after + limit, _MAX_SEQ), "limit": limit}


def read_events(job_id: int, after: int, limit: int) -> list[dict[str, Any]]:
    """The job's stored events with seq > after, in order, at most `limit`.

    It costs what it returns, wherever `after` stands: a page unnests only the batches that
    hold it (those ending after `after`, up to the first ending at or past `after + limit`;
    the store numbers events without gaps, so they hold the whole page), never the rest of
    the job. With no batch reaching that far, every later batch is read: the job's last ones.
    """
    with connection.cursor() as cursor:
        cursor.execute(_READ_EVENTS, _page_params(job_id, after, limit))
        # A raw cursor returns jsonb as text (Django parses JSONField itself): parse detail as live frames do.
        return [event_from_row(row) for row in cursor.fetchall()]


def read_events_json(job_id: int, after: int, limit: int) -> tuple[int, int, int, str] | None:
    """The page `read_events` reads, as (first seq, last seq, count, the events as JSON arrays, comma-separated).

    Encoded by PostgreSQL: every frame a viewer is sent costs the web process one string a
    page, not an object per value. Each array holds an event's values in EVENT_FIELDS order
    (the same values `read_events` gives; a detail's JSON may differ in spacing); None if
    there are no events.
    """
    with connection.cursor() as cursor:
        cursor.execute(_READ_EVENTS_JSON, _page_params(job_id, after, limit))
        first, last, count, text = cursor.fetchone()
    return None if not count else (first, last, count, text)


def pruned_notice(job: Job) -> str:
    """What events.json and the exports answer for a job whose events were deleted (HTTP 410 Gone)."""
    assert job.events_pruned_at is not None
    after = f", {(job.events_pruned_at - job.finished_at).days} days after the job finished" if job.finished_at else ""
    return (
        f"The {job.last_seq} events of job {job.pk} were pruned on {job.events_pruned_at:%Y-%m-%d %H:%M} UTC{after}. "
        f"Its summary and verdict are kept: /jobs/{job.pk}/summary.json."
    )


def events_page(job: Job, after: int, limit: int) -> dict[str, Any]:
    """One page of events.json: the events after `after` and where to ask next."""
    # Read last_seq before the events: the recorder stores events and last_seq in one
    # transaction, so every event up to this last_seq is visible to the query below.
    last_seq = Job.objects.filter(pk=job.pk).values_list("last_seq", flat=True).get()
    events = read_events(job.pk, after, limit)
    next_after = events[-1]["seq"] if events else after
    return {
        "job": job.pk,
        "status": job.status,
        "last_seq": max(last_seq, next_after),
        "after": after,
        "next_after": next_after,
        "more": len(events) == limit or next_after < last_seq,
        "events": events,
    }


def _pages(job_id: int) -> Iterator[list[dict[str, Any]]]:
    after = 0
    while page := read_events(job_id, after, EXPORT_PAGE):
        yield page
        after = page[-1]["seq"]


async def _apages(job_id: int) -> AsyncIterator[list[dict[str, Any]]]:
    after = 0
    while page := await sync_to_async(read_events)(job_id, after, EXPORT_PAGE):
        yield page
        after = page[-1]["seq"]


def _jsonl(page: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(event, separators=(",", ":")) + "\n" for event in page)


class _Line:
    """csv.writer's file: hands back each formatted line instead of storing it."""

    def write(self, line: str) -> str:
        return line


def _csv_lines(page: list[dict[str, Any]]) -> str:
    writer = csv.writer(_Line())
    return "".join(
        writer.writerow([json.dumps(event["detail"]) if name == "detail" else event[name] for name in EVENT_FIELDS])
        for event in page
    )


def _csv_header() -> str:
    return csv.writer(_Line()).writerow(EVENT_FIELDS)


def export_lines(job_id: int, fmt: str) -> Iterator[str]:
    """Every event of the job in seq order, as JSON lines or CSV, a page at a time (WSGI)."""
    if fmt == "csv":
        yield _csv_header()
    for page in _pages(job_id):
        yield _csv_lines(page) if fmt == "csv" else _jsonl(page)


async def aexport_lines(job_id: int, fmt: str) -> AsyncIterator[str]:
    """The same export for an ASGI server, which would otherwise buffer a sync iterator whole."""
    if fmt == "csv":
        yield _csv_header()
    async for page in _apages(job_id):
        yield _csv_lines(page) if fmt == "csv" else _jsonl(page)


# Bin widths for rate charts, picked so that a chart has at most about 150 points.
_BINS_MS = (100, 250, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000)


def bin_for(duration_ms: float) -> int:
    return next((b for b in _BINS_MS if duration_ms / b <= 150), _BINS_MS[-1])


def rate_series(job: Job, bin_ms: int, kinds: Sequence[str]) -> dict[str, list[int]]:
    """Events of each of `kinds` per `bin_ms` bin since the job started, counted in PostgreSQL."""
    counts = (
        Event.objects.filter(job=job, kind__in=list(kinds))
        .annotate(bin=Floor(F("t_ms") / bin_ms))
        .values("bin", "kind")
        .annotate(n=Count("id"))
    )
    series: dict[str, list[int]] = {kind: [] for kind in kinds}
    for row in counts:
        values = series[row["kind"]]
        index = int(row["bin"])
        if index >= len(values):
            values.extend([0] * (index + 1 - len(values)))
        values[index] = row["n"]
    _pad(series.values())
    return series


def _pad(all_values: Iterable[list[int]]) -> None:
    """Extend every list with zeros to the length of the longest."""
    lists = list(all_values)
    length = max((len(values) for values in lists), default=0)
    for values in lists:
        values.extend([0] * (length - len(values)))


def aligned_rate_series(
    jobs: list[Job], bin_ms: int, kinds_of: Mapping[int, Sequence[str]]
) -> list[dict[str, list[int]]]:
    """`rate_series` of each job (its scenario's kinds), padded to one length: charts share their time axis."""
    series = [rate_series(job, bin_ms, kinds_of[job.pk]) for job in jobs]
    _pad([values for one in series for values in one.values()])
    return series


def duration_ms(job: Job) -> float:
    """How long the job's actors ran: from its summary, else from its last event."""
    if job.summary and job.summary.get("duration_s") is not None:
        return float(job.summary["duration_s"]) * 1000.0
    last = Event.objects.filter(job=job).order_by("-seq").values_list("t_ms", flat=True).first()
    return float(last or 0.0)
