"""A write to a versioned object, its log and what the listeners do with it: one statement.

`occviz.store.writes` updates or deletes an object this way:

    WITH "old" AS (the row, locked; a Change id drawn once it is held),
         "new" AS (UPDATE or DELETE the row, if its version is the one expected, RETURNING it),
         "written" AS (the Change: a write, or a refusal, with the object before it),
         "change" AS (INSERT the Change),
         "notice" AS (the Change as the listeners read it),
         <each listener's statements, over "notice">
    SELECT "old".*, "new".*

So the row is held for one statement (and its commit): not for a round trip to the web process
and back between locking it and logging what was done to it, nor for the Python that would run
meanwhile. The object's fields go into the log as JSON made by the database, as `writes.fields_of`
makes them in Python (datetimes as DjangoJSONEncoder writes them, in UTC to the millisecond).

A listener gives statements of its own to run in every write's (`Listener`): data-modifying
statements without parameters, over the one row of "notice" (none for a refusal of a version no
object can have, which is not logged; a dry run's statement has no listener's). "notice"'s columns:

- `change`: the Change's id; `type`: MODIFIED, DELETED or CONFLICT; `at`: when it was written;
- `owner_job`: the job that made the object (NULL if none did); `user_id`: the writer's user, if any;
- `payload`: the write as JSON: change, type, resource, object_id, name, via, writer,
  expected_version (null for a blind write), resource_version (written; stored, for a refusal),
  before (the object's fields as it was locked) and after (as written; for a refusal, as sent).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Final, cast

from django.db import connections, models
from django.db.backends.base.base import BaseDatabaseWrapper

from occviz.store import rows
from occviz.store.cas import Now, swap_for
from occviz.store.models import Change

BOOKKEEPING: Final = frozenset({"id", "resource_version", "job", "created_at"})
"""Not the object's own content: how the store keeps it."""

Listener = Callable[[BaseDatabaseWrapper], Sequence[tuple[str, str]]]
"""`listener(connection)`: (name, statement) pairs, each run as a CTE of every write's statement, after "notice"."""

Shape = tuple[tuple[str, bool | Now], ...] | None
"""The columns an update writes (`cas.shape_of`); None for a delete."""


def json_of(model: type[models.Model], source: str, connection: BaseDatabaseWrapper) -> str:
    """SQL for the JSON `writes.fields_of` makes of an object, from the columns of `source` (a row source's name)."""
    pairs = []
    for field in model._meta.concrete_fields:
        if field.name in BOOKKEEPING:
            continue
        column = f'"{source}".{connection.ops.quote_name(cast(str, field.column))}'
        pairs.append(f"'{field.name}', {_json_value(field, column)}")
    return f"jsonb_build_object({', '.join(pairs)})"


def _json_value(field: models.Field[Any, Any], column: str) -> str:
    if isinstance(field, models.DateTimeField):
        # DjangoJSONEncoder's: ISO 8601 in UTC, milliseconds only if there are microseconds, "Z" for +00:00.
        utc = f"({column} AT TIME ZONE 'UTC')"
        fraction = (
            f"CASE WHEN mod(extract(microseconds FROM {column})::bigint, 1000000) <> 0 THEN to_char({utc}, '.MS') END"
        )
        return f"""to_jsonb(to_char({utc}, 'YYYY-MM-DD"T"HH24:MI:SS') || coalesce({fraction}, '') || 'Z')"""
    if isinstance(field, (models.JSONField, models.CharField, models.IntegerField, models.BooleanField)):
        return column
    raise TypeError(f"{field.model.__name__}.{field.name}: no JSON of a {type(field).__name__} made in SQL")


@functools.cache
def write_sql(
    model: type[models.Model], shape: Shape, check_version: bool, alias: str, listeners: tuple[Listener, ...]
) -> str:
    """The statement of one shape of write (built once). Its parameters, in order:

    the Change's (table, id column) to draw from; the object's primary key; the values of an
    update's `shape`; the expected version, if `check_version`; then the Change's resource, the
    type of a write (MODIFIED or DELETED), its expected version (None for a blind one), via,
    writer, user id, what a refusal logs over the fields stored (JSON), the time, and whether a
    refusal is logged. Its row: the object's columns as locked, the id drawn, and its columns as
    written (all NULL for a refusal); no row if there is no such object (nothing drawn then).
    """
    connection = connections[alias]
    meta = model._meta
    quote = connection.ops.quote_name
    table, pk = quote(meta.db_table), quote(cast(str, meta.pk.column))
    names = [quote(cast(str, field.column)) for field in meta.concrete_fields]
    matched = f'{table}.{pk} = "old".{pk}' + (' AND "old"."resource_version" = %s' if check_version else "")
    if shape is None:
        act = f'DELETE FROM {table} USING "old" WHERE {matched}'
    else:
        act = f'UPDATE {table} SET {swap_for(model, shape, False).assignments} FROM "old" WHERE {matched}'
    stored, written = json_of(model, "old", connection), json_of(model, "new", connection)
    refused = f'"new".{pk} IS NULL'
    change = {field.name: field for field in Change._meta.concrete_fields}

    def typed(name: str) -> str:
        return f"%s::{change[name].db_type(connection)}"

    values = {
        "id": '"old"."drawn"',
        "resource": typed("resource"),
        "namespace": '"old"."namespace"',
        "name": '"old"."name"',
        "object_id": f'"old".{pk}',
        "type": f"CASE WHEN {refused} THEN '{Change.Type.CONFLICT}' ELSE {typed('type')} END",
        "resource_version": 'coalesce("new"."resource_version", "old"."resource_version")',
        "expected_version": typed("expected_version"),
        "via": typed("via"),
        "writer": typed("writer"),
        "user": typed("user"),
        "object": f"CASE WHEN {refused} THEN {stored} || %s::jsonb ELSE {written} END",
        "stored": f"CASE WHEN {refused} THEN {stored} END",
        "at": typed("at"),
    }
    fields = rows.fields_to_insert(Change, True)
    columns = rows.columns_of(fields, connection)
    selected = ", ".join(f"{values[field.name]} AS {quote(cast(str, field.column))}" for field in fields)
    payload = ", ".join(
        f"'{key}', \"written\".{quote(column)}"
        for key, column in (
            ("change", "id"),
            ("type", "type"),
            ("resource", "resource"),
            ("object_id", "object_id"),
            ("name", "name"),
            ("via", "via"),
            ("writer", "writer"),
            ("expected_version", "expected_version"),
            ("resource_version", "resource_version"),
            ("before", "before"),
            ("after", "object"),
        )
    )
    parts = [
        f'"old" AS (SELECT {", ".join(f'"locked".{name}' for name in names)},'
        # The locking subquery is its own plan node, so the id is drawn once the row is held, not while
        # waiting for it: the ids of one object's Changes follow the order its writers held it in.
        f' nextval(pg_get_serial_sequence(%s, %s)) AS "drawn"'
        f' FROM (SELECT * FROM {table} WHERE {pk} = %s FOR UPDATE) AS "locked")',
        f'"new" AS ({act} RETURNING {", ".join(f"{table}.{name}" for name in names)})',
        f'"written" AS (SELECT {selected}, {stored} AS "before", "old"."job_id" AS "owner_job"'
        f' FROM "old" LEFT JOIN "new" ON TRUE WHERE NOT {refused} OR %s)',
        f'"change" AS (INSERT INTO {quote(Change._meta.db_table)} ({columns}) SELECT {columns} FROM "written")',
        '"notice" AS (SELECT "id" AS "change", "type", "at", "owner_job", "user_id",'
        f' jsonb_build_object({payload}) AS "payload" FROM "written")',
    ]
    parts += [f"{quote(name)} AS ({statement})" for listener in listeners for name, statement in listener(connection)]
    return f'WITH {", ".join(parts)} SELECT "old".*, "new".* FROM "old" LEFT JOIN "new" ON TRUE'
