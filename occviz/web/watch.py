"""One object's history as it happens (`kubectl get -w` in the browser): its versions, who wrote them, the conflicts.

Two sources, read by cursor so a viewer polling every half second reads only what is
new: the store's `Change` rows (the admin's and the API's writes and refusals) and, for
an object a job made, that job's events on the object's row (its own writes, each with
the version it read and wrote, and its conflicts). A job's outside-writer lanes are
Changes already, so those events are left out. A counter race writes thousands of
versions a second: a poll sends the newest `NEWEST` entries and counts per writer.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

from django.db import connection
from django.db.models import Count, Max

from occviz.jobs.models import Job
from occviz.scenarios import SCENARIOS
from occviz.store.models import Change, Counter, Lease, Pod, ResourceQuota, VersionedObject
from occviz.store.writes import fields_of

RESOURCES: Final[dict[str, type[VersionedObject]]] = {
    model.kind_plural: model for model in (Counter, Lease, Pod, ResourceQuota)
}
NEWEST: Final = 50
"""Entries a poll sends (and the page keeps): the newest; the counts cover every version."""
# A job's event kinds that are a refused write to the object (the others with version_written wrote it).
_JOB_CONFLICTS: Final = ("conflict",)
_VIA_WORDS: Final = {"admin": "admin", "api": "API"}


def find(resource: str, namespace: str, name: str) -> VersionedObject | None:
    """The object as stored now, or None (deleted, or never made: its Changes may still tell its story)."""
    return RESOURCES[resource]._default_manager.filter(namespace=namespace, name=name).first()


def history(resource: str, namespace: str, name: str, *, after_change: int = 0, after_seq: int = 0) -> dict[str, Any]:
    """What happened to the object since the cursors: the newest entries, counts per writer, new cursors."""
    obj = find(resource, namespace, name)
    changes = Change.objects.filter(resource=resource, namespace=namespace, name=name, id__gt=after_change)
    # The new cursor first, and the entries and counts up to it: each query sees the Changes
    # committed by its own start, so a Change committed between them would otherwise be past
    # the cursor without having been counted, and never shown.
    last_change = changes.aggregate(last=Max("id"))["last"] or after_change
    changes = changes.filter(id__lte=last_change)
    entries = [_change_entry(change) for change in changes.order_by("-id")[:NEWEST]]
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


def _change_entry(change: Change) -> dict[str, Any]:
    version = change.resource_version
    conflict = change.type == Change.Type.CONFLICT
    if conflict:
        what = f"409 Conflict: had v{change.expected_version}, stored v{version}"
    elif change.blind:
        what = f"blind write (no resourceVersion): {_fields_words(change.object)}"
    else:
        what = _fields_words(change.object)
    return {
        "key": f"c{change.pk}",
        "version": version,
        "type": change.type,
        "writer": f"{_VIA_WORDS.get(change.via, change.via)}: {change.writer}",
        "what": what,
        "at": change.at.isoformat(),
    }


def _fields_words(fields: dict[str, Any]) -> str:
    """The fields a person looks at first: a counter's value, a lease's holder, else all of them."""
    for key in ("value", "holder_identity", "used", "phase"):
        if key in fields:
            return f"{key} {fields[key]!r}" if key != "value" else f"value {fields[key]}"
    return ", ".join(f"{key} {value!r}" for key, value in fields.items())


def _job_history(
    job: Job, row: int, after_seq: int, entries: list[dict[str, Any]], counts: dict[str, dict[str, int]]
) -> int:
    """Add the job's own writes to the row since `after_seq`; the job's newest seq read."""
    spec = SCENARIOS.get(job.scenario)
    # Only new batches (batch_seq_to > after_seq uses the job's index), only the row's writes and
    # conflicts, never the outside lanes (their Changes are read above).
    # Every event up to the job's last_seq is stored (the recorder moves it with the batch): read to there.
    last_seq = max(after_seq, Job.objects.filter(pk=job.pk).values_list("last_seq", flat=True).get())
    where = (
        "job_id = %s AND batch_seq_to > %s AND seq > %s AND seq <= %s AND row = %s AND NOT detail ? 'lane' "
        "AND (version_written IS NOT NULL OR kind = ANY(%s))"
    )
    params: list[Any] = [job.pk, after_seq, after_seq, last_seq, row, list(_JOB_CONFLICTS)]
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT seq, t_ms, actor, kind, version_read, version_written, value_read, value_written "
            f"FROM jobs_event WHERE {where} ORDER BY seq DESC LIMIT %s",
            [*params, NEWEST],
        )
        newest = cursor.fetchall()
        cursor.execute(
            f"SELECT actor, kind = ANY(%s), count(*) FROM jobs_event WHERE {where} GROUP BY 1, 2",
            [list(_JOB_CONFLICTS), *params],
        )
        grouped = cursor.fetchall()

    def who(actor: int) -> str:
        return f"job {job.pk}: {spec.actor_name(actor) if spec else f'actor {actor}'}"

    for actor, conflict, n in grouped:
        _count(counts, who(actor), Change.Type.CONFLICT if conflict else Change.Type.MODIFIED, n)
    started = job.started_at or job.created_at
    for seq, t_ms, actor, kind, version_read, version_written, value_read, value_written in newest:
        conflict = kind in _JOB_CONFLICTS
        entries.append(
            {
                "key": f"j{job.pk}.{seq}",
                "version": version_read if conflict else version_written,
                "type": "CONFLICT" if conflict else "MODIFIED",
                "writer": who(actor),
                "what": (
                    f"conflict: had v{version_read}, the row had moved on"
                    if conflict
                    else f"{kind}: value {value_read} → {value_written}"
                    if value_written is not None and job.scenario == "counter"
                    else kind
                ),
                "at": (started + timedelta(milliseconds=t_ms)).isoformat(),
            }
        )
    return last_seq
