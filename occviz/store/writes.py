"""Writes to the versioned objects from outside a job: the admin's and the API's.

They go through the same compare-and-swap as a job's writes, and each one, or each refusal,
is logged as a `Change`: who wrote (the admin's user, the API's user and token), which
version they had read (none for a blind write) and which they wrote. The layers above
register listeners at start-up, statements of their own that run inside every update's,
delete's and refusal's (the jobs app hands a write to a running job's objects to that job,
which records it on a lane named after the writer: a student's `kubectl replace` shows up
on the job page next to the job's own conflicts). The store knows nothing of who listens.

One statement locks the row, writes it, logs the Change and runs the listeners'
statements (`occviz.store.statements`), so the Change records exactly what was stored
before and after the write, listeners hear of the writes to one object in the order they
commit, and a listener's failure undoes the write. A stale expected version writes nothing
and raises VersionConflict once the refusal is logged and committed (unless the caller has
a transaction of its own, which the raise rolls back with the log). A version beyond the
bigint column's range is one no object can have: it is refused the same way, but not
logged (the log's column could not hold it).

`dry_run()` makes writes as they would be made (the version check, the row lock, the
refusal) in a transaction it then rolls back, and runs no listener: the API's `dryRun=All`.
`pipelined()` sends what waits for no answer with the next statement that does, and
`pipelined_transaction()` sends the commit with them too: a writer that wants its row held as
briefly as can be (a student's press) writes in it, its write the last statement (`last=True`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connections, transaction
from django.utils import timezone

from occviz.store import rows, statements
from occviz.store.cas import ANY, Add, Now, shape_of, swap_for
from occviz.store.models import Change, VersionConflict, VersionedObject

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


_listeners: list[statements.Listener] = []


def add_listener(listener: statements.Listener) -> None:
    """`listener`'s statements run in every write's and refusal's statement, the row locked (`store.statements`)."""
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
    start and end of the transaction would each cost a round trip of their own): there, the
    statements a caller sends before the one it reads (setting its timeouts, locking another row)
    go with that one, not one round trip each. An error is raised where an answer is read: at
    the latest, when the block ends.
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
        field.name: getattr(obj, field.attname)
        for field in obj._meta.concrete_fields
        if field.name not in statements.BOOKKEEPING
    }
    return json.loads(json.dumps(values, cls=DjangoJSONEncoder))


def create[V: VersionedObject](model: type[V], fields: Mapping[str, Any], writer: Writer) -> V:
    """Store a new object (version 1); AlreadyExists if its namespace already has one of that name."""
    obj = model(**fields)
    try:
        with transaction.atomic():
            obj.save()
            Change.objects.create(
                resource=obj.kind_plural,
                namespace=obj.namespace,
                name=obj.name,
                object_id=obj.pk,
                type=Change.Type.ADDED,
                resource_version=obj.resource_version,
                via=writer.via,
                writer=writer.name,
                user=writer.user if getattr(writer.user, "pk", None) else None,
                object=fields_of(obj),
            )
    except IntegrityError as error:
        if model._default_manager.filter(namespace=obj.namespace, name=obj.name).exists():
            raise AlreadyExists(model, obj.name) from error
        raise
    return obj


def update[V: VersionedObject](
    obj: V, changes: Mapping[str, Any], writer: Writer, *, expected_version: int | object, last: bool = False
) -> V:
    """Write `changes` to `obj` if its stored version is `expected_version` (ANY: a blind write).

    Returns the object as stored after the write. A stale version writes nothing and raises
    VersionConflict (its `stored` is the object as it is now); a deleted object raises DoesNotExist.

    One statement locks the row, writes it, logs the Change and runs the listeners' statements
    (`occviz.store.statements`), so the row is held for that statement and the commit. With
    `last`, the write is the last statement of the caller's `pipelined_transaction`, and its
    commit goes with it: the row is held for no round trip of its own.
    """
    # A refusal logs the values sent over the fields stored (an Add or NOW is no value of a field);
    # a blind write is never refused.
    sent = {name: value for name, value in changes.items() if not isinstance(value, (Add, Now))}
    attempted = "{}" if expected_version is ANY else json.dumps(sent, cls=DjangoJSONEncoder)
    return _write(
        obj, Change.Type.MODIFIED, shape_of(changes), changes.values(), writer, expected_version, attempted, last
    )


def delete[V: VersionedObject](obj: V, writer: Writer, *, expected_version: int | object = ANY) -> V:
    """Delete `obj` if its stored version is `expected_version`; the object as it was. As `update` for refusals."""
    return _write(obj, Change.Type.DELETED, None, (), writer, expected_version, json.dumps(fields_of(obj)), False)


def _write[V: VersionedObject](
    obj: V,
    type_: str,
    shape: statements.Shape,
    values: Iterable[Any],
    writer: Writer,
    expected_version: int | object,
    attempted: str,
    last: bool,
) -> V:
    """Update (a `shape` of columns) or delete `obj` in one statement, logged as a Change of `type_` or a refusal.

    A refusal logs `attempted` (JSON) over the fields stored, unless its version is one no
    object ever had (the log's bigint column could not hold it either).
    """
    model = type(obj)
    db = obj._state.db or "default"
    connection = connections[db]
    check = expected_version is not ANY
    logged = not (isinstance(expected_version, int) and not 0 <= expected_version <= MAX_VERSION)
    listeners = () if _dry_run.get() else tuple(_listeners)
    params: list[Any] = [*_CHANGE_IDS, obj.pk]
    if shape is not None:
        params += swap_for(model, shape, False).assigned(values, connection)
    if check:
        params.append(expected_version)
    user = writer.user.pk if getattr(writer.user, "pk", None) else None
    expected = expected_version if check and logged else None
    params += [model.kind_plural, type_, expected, writer.via, writer.name, user, attempted, timezone.now(), logged]
    if last:
        _check_last(db)
    with connection.cursor() as cursor:
        cursor.execute(statements.write_sql(model, shape, check, db, listeners), params)
        if last:
            connection.connection.commit()  # queued behind the write, and sent with it
        row = cursor.fetchone()
    if row is None:
        raise model.DoesNotExist(f"{model.__name__} {obj.pk} does not exist")
    fields = model._meta.concrete_fields
    after = row[len(fields) + 1 :]
    if after[0] is not None:
        return rows.from_row(model, db, fields, after)
    stored = rows.from_row(model, db, fields, row[: len(fields)])
    conflict = VersionConflict(stored, expected_version)
    conflict.stored = stored
    raise conflict


def _check_last(db: str) -> None:
    connection = connections[db]
    if not (connection.in_atomic_block and connection.connection.pgconn.pipeline_status):
        raise transaction.TransactionManagementError(
            "a write with last=True ends a pipelined_transaction(): none is open"
        )
