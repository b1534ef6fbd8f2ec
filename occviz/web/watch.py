"""One object's history as it happens (`kubectl get -w` in the browser): its versions, who wrote them, the conflicts.

Two sources, read by cursor so a viewer polling every half second reads only what is
new: the store's `Change` rows (the admin's and the API's writes and refusals) and, for
an object a job made, that job's events on the object's row (the kinds its scenario
declares a write or a refused one, each with the version it read and wrote, worded as the
job page words them). A job's outside-writer lanes are Changes already, so those events
are left out. A counter race writes thousands of versions a second: a poll sends the
newest `NEWEST` entries and counts per writer.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

from django.db import connection
from django.db.models import Count, Max

from occviz.jobs.events import EVENT_FIELDS, event_from_row
from occviz.jobs.models import Job
from occviz.scenarios import SCENARIOS
from occviz.store.kinds import BY_PLURAL
from occviz.store.models import Change, VersionedObject
from occviz.store.writes import fields_of

NEWEST: Final = 50
"""Entries a poll sends (and the page keeps): the newest; the counts cover every version."""
_VIA_WORDS: Final = {"admin": "admin", "api": "API"}


def find(resource: str, namespace: str, name: str) -> VersionedObject | None:
    """The object as stored now, or None (deleted, or never made: its Changes may still tell its story)."""
    return BY_PLURAL[resource].model._default_manager.filter(namespace=namespace, name=name).first()


def history(resource: str, namespace: str, name: str, *, after_change: int = 0, after_seq: int = 0) -> dict[str, Any]:
    """What happened to the object since the cursors: the newest entries, counts per writer, new cursors."""
    obj = find(resource, namespace, name)
    changes = Change.objects.filter(resource=resource, namespace=namespace, name=name, id__gt=after_change)
    # The new cursor first, and the entries and counts up to it: each query sees the Changes
    # committed by its own start, so a Change committed between them would otherwise be past
    # the cursor without having been counted, and never shown.
    last_change = changes.aggregate(last=Max("id"))["last"] or after_change
    changes = changes.filter(id__lte=last_change)
    shown = BY_PLURAL[resource].shown
    entries = [_change_entry(change, shown) for change in changes.order_by("-id")[:NEWEST]]
    counts: dict[str, dict[str, int]] = {}
    for row in changes.values("via", "writer", "type").annotate(n=Count("id")):
        _count(counts, f"{_VIA_WORDS.get(row['via'], row['via'])}: {row['writer']}", row["type"], row["n"])
    job = Job.objects.filter(pk=obj.job_id).first() if obj is not None and obj.job_id else None
    last_seq = after_seq
    if job is not None and obj is not None:
        last_seq = _job_history(job, obj.pk, after_seq, entries, counts)
    entries.sort(key=lambda entry: (entry["version"] or 0, entry["at"]), reverse=True)
    return {
        "object": None if obj is None else {"version": obj.resource_version, "fields": fields_of(obj)},
        "job": None if job is None else {"id": job.pk, "status": job.status, "scenario": job.scenario},
        "entries": entries[:NEWEST],
        "counts": counts,
        "after_change": last_change,
        "after_seq": last_seq,
    }


def _count(counts: dict[str, dict[str, int]], writer: str, type_: str, n: int) -> None:
    tally = counts.setdefault(writer, {"versions": 0, "conflicts": 0})
    tally["conflicts" if type_ == Change.Type.CONFLICT else "versions"] += n


def _change_entry(change: Change, shown: tuple[str, ...]) -> dict[str, Any]:
    version = change.resource_version
    conflict = change.type == Change.Type.CONFLICT
    if conflict:
        what = f"409 Conflict: had v{change.expected_version}, stored v{version}"
    elif change.blind:
        what = f"blind write (no resourceVersion): {_fields_words(change.object, shown)}"
    else:
        what = _fields_words(change.object, shown)
    return {
        "key": f"c{change.pk}",
        "version": version,
        "type": change.type,
        "writer": f"{_VIA_WORDS.get(change.via, change.via)}: {change.writer}",
        "what": what,
        "at": change.at.isoformat(),
    }


def _fields_words(fields: dict[str, Any], shown: tuple[str, ...]) -> str:
    """The fields its kind shows (a counter's value, a lease's holder), else all of them."""
    words = [f"{key} {fields[key]!r}" for key in shown if key in fields]
    return ", ".join(words or [f"{key} {value!r}" for key, value in fields.items()])


def _job_history(
    job: Job, row: int, after_seq: int, entries: list[dict[str, Any]], counts: dict[str, dict[str, int]]
) -> int:
    """Add the job's own writes to the row since `after_seq`, worded as its scenario words them; the newest seq read."""
    # Every event up to the job's last_seq is stored (the recorder moves it with the batch): read to there.
    last_seq = max(after_seq, Job.objects.filter(pk=job.pk).values_list("last_seq", flat=True).get())
    spec = SCENARIOS.get(job.scenario)
    if spec is None:
        return last_seq
    # The kinds its scenario declares a write to an event's row, or a refused one.
    writes = [kind.name for kind in spec.kinds if kind.writes]
    refused = [kind.name for kind in spec.kinds if kind.refused]
    # Only new batches (batch_seq_to > after_seq uses the job's index), only the row's writes and
    # refusals, never the outside lanes (their Changes are read above).
    where = (
        "job_id = %s AND batch_seq_to > %s AND seq > %s AND seq <= %s AND row = %s AND NOT detail ? 'lane' "
        "AND kind = ANY(%s)"
    )
    params: list[Any] = [job.pk, after_seq, after_seq, last_seq, row, writes + refused]
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {', '.join(EVENT_FIELDS)} FROM jobs_event WHERE {where} ORDER BY seq DESC LIMIT %s",
            [*params, NEWEST],
        )
        newest = [event_from_row(found) for found in cursor.fetchall()]
        cursor.execute(
            f"SELECT actor, kind = ANY(%s), count(*) FROM jobs_event WHERE {where} GROUP BY 1, 2",
            [refused, *params],
        )
        grouped = cursor.fetchall()

    def who(actor: int) -> str:
        return f"job {job.pk}: {spec.actor_name(actor)}"

    for actor, conflict, n in grouped:
        _count(counts, who(actor), Change.Type.CONFLICT if conflict else Change.Type.MODIFIED, n)
    started = job.started_at or job.created_at
    for event in newest:
        conflict = event["kind"] in refused
        entries.append(
            {
                "key": f"j{job.pk}.{event['seq']}",
                "version": event["version_read"] if conflict else event["version_written"],
                "type": "CONFLICT" if conflict else "MODIFIED",
                "writer": who(event["actor"]),
                "what": spec.describe(event),
                "at": (started + timedelta(milliseconds=event["t_ms"])).isoformat(),
            }
        )
    return last_seq
