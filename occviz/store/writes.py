"""Writes to the versioned objects from outside a job: the admin's and the API's.

They go through compare_and_swap like a job's writes, and each one, or each refusal, is
logged as a `Change`: who wrote (the admin's user, the API's user and token), which
version they had read (none for a blind write) and which they wrote. When the object
belongs to a running job, the write is also handed to that job (a JobControl "outside"),
which records it among its own events on a lane named after the writer: a student's
`kubectl replace` shows up on the job page next to the job's own conflicts.

The row is locked for the few statements of the write, so the Change records exactly
what was stored before and after it. A stale expected version writes nothing and
raises VersionConflict once the refusal is logged and committed (unless the caller has a
transaction of its own, which the raise rolls back with the log).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction

from occviz.jobs.models import Job, JobNotRunning
from occviz.store.cas import ANY, compare_and_swap
from occviz.store.models import Change, VersionConflict, VersionedObject

# Not the object's own content: how the store keeps it.
_BOOKKEEPING = {"id", "resource_version", "job", "created_at"}


@dataclass(frozen=True)
class Writer:
    """Who is writing: `via` a Change.Via, `name` as the history shows it ("alice (token laptop)")."""

    via: str
    name: str
    user: Any = None

    def __str__(self) -> str:
        return f"{self.via} {self.name}"


class AlreadyExists(Exception):
    def __init__(self, model: type[VersionedObject], name: str) -> None:
        self.model = model
        self.name = name
        super().__init__(f'{model.qualified_resource()} "{name}" already exists')


def fields_of(obj: VersionedObject) -> dict[str, Any]:
    """The object's content as JSON values (datetimes as ISO text), without the store's bookkeeping."""
    values = {
        field.name: getattr(obj, field.attname) for field in obj._meta.concrete_fields if field.name not in _BOOKKEEPING
    }
    return json.loads(json.dumps(values, cls=DjangoJSONEncoder))


def create[V: VersionedObject](model: type[V], fields: Mapping[str, Any], writer: Writer) -> V:
    """Store a new object (version 1); AlreadyExists if its namespace already has one of that name."""
    obj = model(**fields)
    try:
        with transaction.atomic():
            obj.save()
            _log(obj, Change.Type.ADDED, writer, version=obj.resource_version, content=fields_of(obj))
    except IntegrityError as error:
        if model._default_manager.filter(namespace=obj.namespace, name=obj.name).exists():
            raise AlreadyExists(model, obj.name) from error
        raise
    return obj


def update[V: VersionedObject](
    obj: V, changes: Mapping[str, Any], writer: Writer, *, expected_version: int | object
) -> V:
    """Write `changes` to `obj` if its stored version is `expected_version` (ANY: a blind write).

    Returns the object as stored after the write. A stale version writes nothing and raises
    VersionConflict (its `stored` is the object as it is now); a deleted object raises DoesNotExist.
    """
    model = type(obj)
    with transaction.atomic():
        stored = model._default_manager.select_for_update().get(pk=obj.pk)
        if expected_version is ANY or stored.resource_version == expected_version:
            compare_and_swap(model, obj.pk, ANY, changes)
            written = model._default_manager.get(pk=obj.pk)
            change = _log(
                written,
                Change.Type.MODIFIED,
                writer,
                version=written.resource_version,
                expected=expected_version,
                content=fields_of(written),
            )
            _tell_job(written, change, before=fields_of(stored))
            return written
        attempted = fields_of(stored) | json.loads(json.dumps(dict(changes), cls=DjangoJSONEncoder))
        conflict = _refuse(stored, writer, expected_version, attempted)
    raise conflict


def delete[V: VersionedObject](obj: V, writer: Writer, *, expected_version: int | object = ANY) -> V:
    """Delete `obj` if its stored version is `expected_version`; the object as it was. As `update` for refusals."""
    model = type(obj)
    with transaction.atomic():
        stored = model._default_manager.select_for_update().get(pk=obj.pk)
        if expected_version is ANY or stored.resource_version == expected_version:
            content = fields_of(stored)
            change = _log(
                stored,
                Change.Type.DELETED,
                writer,
                version=stored.resource_version,
                expected=expected_version,
                content=content,
            )
            _tell_job(stored, change, before=content)
            model._default_manager.filter(pk=obj.pk).delete()
            return stored
        conflict = _refuse(stored, writer, expected_version, fields_of(obj))
    raise conflict


def _refuse(
    stored: VersionedObject, writer: Writer, expected_version: int | object, attempted: dict[str, Any]
) -> VersionConflict:
    """Log a refused write (and tell the job) while the row is still locked, so that the Changes
    of one object are numbered in the order they commit: a watcher reading past the newest
    one it saw misses none. The caller raises the conflict once its transaction has committed."""
    change = _log(
        stored,
        Change.Type.CONFLICT,
        writer,
        version=stored.resource_version,
        expected=expected_version,
        content=attempted,
        stored=fields_of(stored),
    )
    _tell_job(stored, change, before=fields_of(stored))
    conflict = VersionConflict(stored, expected_version)
    conflict.stored = stored
    return conflict


def _log(
    obj: VersionedObject,
    type_: str,
    writer: Writer,
    *,
    version: int | None,
    content: dict[str, Any],
    expected: int | object = ANY,
    stored: dict[str, Any] | None = None,
) -> Change:
    return Change.objects.create(
        resource=obj.kind_plural,
        namespace=obj.namespace,
        name=obj.name,
        object_id=obj.pk,
        type=type_,
        resource_version=version,
        expected_version=expected if isinstance(expected, int) else None,
        via=writer.via,
        writer=writer.name,
        user=writer.user if getattr(writer.user, "pk", None) else None,
        object=content,
        stored=stored,
    )


def _tell_job(obj: VersionedObject, change: Change, *, before: dict[str, Any]) -> None:
    """Hand the write (or refusal) to the job that owns the object, if it is running."""
    if obj.job_id is None:
        return
    payload = {
        "change": change.pk,
        "type": change.type,
        "resource": change.resource,
        "object_id": change.object_id,
        "name": change.name,
        "via": change.via,
        "writer": change.writer,
        "expected_version": change.expected_version,
        "resource_version": change.resource_version,
        "before": before,
        "after": change.object,
    }
    with contextlib.suppress(JobNotRunning):  # a finished job's objects are just objects
        Job(pk=obj.job_id).request_control("outside", payload=payload, user=change.user)
