"""Writes to the versioned objects from outside a job: the admin's and the API's.

They go through compare_and_swap like a job's writes, and each one, or each refusal, is
logged as a `Change`: who wrote (the admin's user, the API's user and token), which
version they had read (none for a blind write) and which they wrote. Each update, delete
or refusal is then announced, as a `WriteNotice`, to the listeners the layers above
register at start-up (the jobs app hands a write to a running job's objects to that job,
which records it on a lane named after the writer: a student's `kubectl replace` shows up
on the job page next to the job's own conflicts). The store knows nothing of who listens.

The row is locked for the few statements of the write, so the Change records exactly
what was stored before and after it, and listeners hear of the writes to one object in
the order they commit (in the write's transaction: a listener's failure undoes the write).
A stale expected version writes nothing and raises VersionConflict once the refusal is
logged and committed (unless the caller has a transaction of its own, which the raise
rolls back with the log). A version beyond the bigint column's range is one no object can
have: it is refused the same way, but not logged (the log's column could not hold it).

`dry_run()` makes writes as they would be made (the version check, the row lock, the
refusal) in a transaction it then rolls back, and tells no listener: the API's `dryRun=All`.
`pipelined()` sends what waits for no answer with the next statement that does, and
`pipelined_transaction()` sends the commit with them too: a writer that wants its row held as
briefly as can be (a student's press) writes in it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connections, transaction

from occviz.store import rows
from occviz.store.cas import ANY, swap_locked
from occviz.store.models import Change, VersionConflict, VersionedObject

# Not the object's own content: how the store keeps it.
_BOOKKEEPING = {"id", "resource_version", "job", "created_at"}
MAX_VERSION: Final = 2**63 - 1
"""Versions are PostgreSQL bigints: no object has a version above this."""
_dry_run: ContextVar[bool] = ContextVar("dry_run", default=False)
_CHANGE_IDS: Final = (Change._meta.db_table, "id")
"""Where a write draws its Change's id from: the column's sequence."""


@dataclass(frozen=True)
class Writer:
    """Who is writing: `via` a Change.Via, `name` as the history shows it ("alice (token laptop)")."""

    via: str
    name: str
    user: Any = None

    def __str__(self) -> str:
        return f"{self.via} {self.name}"


@dataclass(frozen=True)
class WriteNotice:
    """One write (or refusal) as its listeners hear of it: the Change logged, and the object before and after."""

    change: int
    """The Change's id."""
    type: str
    """A Change.Type: MODIFIED, DELETED, or CONFLICT for a refusal."""
    resource: str
    namespace: str
    name: str
    object_id: int
    owner_job: int | None
    """The job that made the object, if one did."""
    via: str
    writer: str
    user: Any
    expected_version: int | None
    """The version the writer had read; None for a blind write."""
    resource_version: int | None
    """The version written; for a refusal, the version stored."""
    before: dict[str, Any]
    after: dict[str, Any]
    """The object's fields after the write; for a refusal, what the writer sent."""

    def payload(self) -> dict[str, Any]:
        """The notice as JSON values (who wrote is in `via` and `writer`; the user is left out)."""
        return {
            "change": self.change,
            "type": self.type,
            "resource": self.resource,
            "object_id": self.object_id,
            "name": self.name,
            "via": self.via,
            "writer": self.writer,
            "expected_version": self.expected_version,
            "resource_version": self.resource_version,
            "before": self.before,
            "after": self.after,
        }


WriteListener = Callable[[WriteNotice], None]
_listeners: list[WriteListener] = []


def add_listener(listener: WriteListener) -> None:
    """`listener(notice)` hears of every write and refusal, in its transaction, the object's row still locked."""
    if listener not in _listeners:
        _listeners.append(listener)


@contextmanager
def dry_run() -> Iterator[None]:
    """Inside, writes are made (checked, locked, refused) and then rolled back, and no listener hears of them.

    Everything inside runs in one transaction rolled back at the end, whether the block
    ends or raises: no object, no version, no Change, no quota charge outlives it. The
    listeners (a running job's lane) are not called at all, so nothing leaves the
    transaction that the rollback could not take back.
    """
    held = _dry_run.set(True)
    try:
        with transaction.atomic():
            yield
            transaction.set_rollback(True)
    finally:
        _dry_run.reset(held)


@contextmanager
def pipelined(using: str = "default") -> Iterator[None]:
    """Inside, statements whose answer nobody reads wait to be sent with the next one that is read, or the end.

    PostgreSQL's pipeline mode, inside a caller's transaction (entered outside one, Django's
    start and end of the transaction would each cost a round trip of their own): there, an
    `update` holds its row for the statement that locks and writes it, one round trip for the
    Change and what the listeners write, and the commit; not one round trip each. An error is
    raised where an answer is read: at the latest, when the block ends.
    """
    connection = connections[using]
    connection.ensure_connection()
    # What the pipeline raises as it ends is PostgreSQL's error as Django words it, as a statement's would be.
    with connection.wrap_database_errors, connection.connection.pipeline():
        yield


@contextmanager
def pipelined_transaction(using: str = "default") -> Iterator[None]:
    """A transaction in PostgreSQL's pipeline mode whose COMMIT goes with its last statements.

    `with transaction.atomic(), pipelined():` ends with a round trip for what waits in the
    pipeline and then one for the commit; this ends with one for both, so a row locked in it
    is held a round trip less. An error in the block, or where the last answers are read,
    rolls everything back. It is the outermost transaction: a commit inside another would end it.
    """
    connection = connections[using]
    if connection.in_atomic_block:
        raise transaction.TransactionManagementError("pipelined_transaction() cannot be inside another transaction")
    with transaction.atomic(using=using), pipelined(using):
        yield
        if not connection.needs_rollback:
            # Queued behind the block's statements and sent with them; Django's commit then has nothing left to do.
            connection.connection.commit()


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

    The row is locked, written and read back in one statement, which also draws the Change's
    id; the Change and what the listeners do wait for no answer from the database. So in a
    caller's pipeline (`pipelined`) the row is held for three round trips: that statement, the
    rest at once, and the commit; in a `pipelined_transaction`, for two (the commit goes with the rest).
    """
    model = type(obj)
    db = obj._state.db or "default"
    # No savepoint inside a caller's transaction: the row stays locked from the first statement to the
    # commit, and each statement is a round trip that other writers of the row wait for.
    with transaction.atomic(using=db, savepoint=False):
        swapped = swap_locked(model, obj.pk, expected_version, changes, draw=_CHANGE_IDS, using=db)
        if swapped is None:
            conflict = None
        else:
            stored = rows.from_row(model, db, model._meta.concrete_fields, swapped.before)
            if swapped.after is not None:
                written = rows.from_row(model, db, model._meta.concrete_fields, swapped.after)
                _told(written, Change.Type.MODIFIED, writer, expected_version, fields_of(stored), pk=swapped.number)
                return written
            attempted = fields_of(stored) | json.loads(json.dumps(dict(changes), cls=DjangoJSONEncoder))
            conflict = _refuse(stored, writer, expected_version, attempted, pk=swapped.number)
    if conflict is None:
        raise model.DoesNotExist(f"{model.__name__} {obj.pk} does not exist")
    raise conflict


def delete[V: VersionedObject](obj: V, writer: Writer, *, expected_version: int | object = ANY) -> V:
    """Delete `obj` if its stored version is `expected_version`; the object as it was. As `update` for refusals."""
    model = type(obj)
    with transaction.atomic(savepoint=False):
        stored = _locked(model, obj.pk)
        if stored is None:
            conflict = None
        elif expected_version is ANY or stored.resource_version == expected_version:
            _told(stored, Change.Type.DELETED, writer, expected_version, fields_of(stored))
            model._default_manager.filter(pk=obj.pk).delete()
            return stored
        else:
            conflict = _refuse(stored, writer, expected_version, fields_of(obj))
    if conflict is None:
        raise model.DoesNotExist(f"{model.__name__} {obj.pk} does not exist")
    raise conflict


def _locked[V: VersionedObject](model: type[V], pk: Any) -> V | None:
    """The object as stored, its row locked until the transaction ends; None if it was deleted.

    None rather than DoesNotExist raised inside the write's block: without a savepoint of its
    own, an exception leaving the block would spoil the caller's transaction.
    """
    return model._default_manager.select_for_update().filter(pk=pk).first()


def _told(
    obj: VersionedObject,
    type_: str,
    writer: Writer,
    expected_version: int | object,
    before: dict[str, Any],
    *,
    pk: int | None = None,
) -> None:
    """Log a write that was made (the object as it left it), and announce it: while the row is still locked."""
    change = _log(
        obj, type_, writer, version=obj.resource_version, expected=expected_version, content=fields_of(obj), pk=pk
    )
    _announce(obj, change, before=before)


def _refuse(
    stored: VersionedObject,
    writer: Writer,
    expected_version: int | object,
    attempted: dict[str, Any],
    *,
    pk: int | None = None,
) -> VersionConflict:
    """Log a refused write (and announce it) while the row is still locked, so that the Changes
    of one object are numbered in the order they commit: a watcher reading past the newest
    one it saw misses none. The caller raises the conflict once its transaction has committed."""
    conflict = VersionConflict(stored, expected_version)
    conflict.stored = stored
    if isinstance(expected_version, int) and not 0 <= expected_version <= MAX_VERSION:
        return conflict  # no object ever had it; the log's bigint column could not hold it either
    change = _log(
        stored,
        Change.Type.CONFLICT,
        writer,
        version=stored.resource_version,
        expected=expected_version,
        content=attempted,
        stored=fields_of(stored),
        pk=pk,
    )
    _announce(stored, change, before=fields_of(stored))
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
    pk: int | None = None,
) -> Change:
    """Log a write as a Change. With its id (`pk`, drawn already), the INSERT waits for no answer."""
    change = Change(
        pk=pk,
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
    db = obj._state.db or "default"
    if pk is None:
        change.save(force_insert=True, using=db)
    else:
        rows.insert(change, using=db)
    return change


def _announce(obj: VersionedObject, change: Change, *, before: dict[str, Any]) -> None:
    if not _listeners or _dry_run.get():
        return
    notice = WriteNotice(
        change=change.pk,
        type=change.type,
        resource=change.resource,
        namespace=change.namespace,
        name=change.name,
        object_id=change.object_id,
        owner_job=obj.job_id,
        via=change.via,
        writer=change.writer,
        user=change.user,
        expected_version=change.expected_version,
        resource_version=change.resource_version,
        before=before,
        after=change.object,
    )
    for listener in _listeners:
        listener(notice)
