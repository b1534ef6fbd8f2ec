"""A row inserted by a statement made once per model and database: for rows written while another is held.

`Model.save()` and Django's `InsertQuery` build the INSERT anew for every row. A writer that
inserts its log while it holds a contended row (a student's press: the Change, the job's
hand-off) pays for that building with the row locked, and every writer queued behind it waits
as long. Here the statement is built once (`insert_sql`), and each row only has its values
prepared (`values_of`, as `save()` prepares them); `insert` reads no answer, so in a pipeline
(`occviz.store.writes.pipelined`) it waits for no round trip either.
"""

from __future__ import annotations

import functools
from typing import Any, cast

from django.db import connections, models
from django.db.backends.base.base import BaseDatabaseWrapper


@functools.cache
def fields_to_insert(model: type[models.Model], with_pk: bool) -> tuple[models.Field[Any, Any], ...]:
    """The concrete fields an INSERT of `model` names, in order (its primary key first, if `with_pk`)."""
    return tuple(field for field in model._meta.concrete_fields if with_pk or not field.primary_key)


def columns_of(fields: tuple[models.Field[Any, Any], ...], connection: BaseDatabaseWrapper) -> str:
    """The fields' columns, quoted, comma-separated: an INSERT's column list."""
    return ", ".join(connection.ops.quote_name(cast(str, field.column)) for field in fields)


@functools.cache
def insert_sql(model: type[models.Model], alias: str) -> str:
    """`INSERT INTO <table> (<every concrete field's column>) VALUES (%s, ...)`, primary key included."""
    connection = connections[alias]
    fields = fields_to_insert(model, True)
    return (
        f"INSERT INTO {connection.ops.quote_name(model._meta.db_table)} ({columns_of(fields, connection)})"
        f" VALUES ({', '.join(['%s'] * len(fields))})"
    )


def values_of(
    obj: models.Model, fields: tuple[models.Field[Any, Any], ...], connection: BaseDatabaseWrapper
) -> list[Any]:
    """`obj`'s values for `fields`, prepared as `save()` prepares a new row's (defaults, auto_now_add...)."""
    return [field.get_db_prep_save(field.pre_save(obj, add=True), connection) for field in fields]


def insert(obj: models.Model, *, using: str) -> None:
    """Insert `obj`, whose primary key is set, reading no answer; `obj` is then as `save()` leaves a new row."""
    model = type(obj)
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute(insert_sql(model, using), values_of(obj, fields_to_insert(model, True), connection))
    obj._state.adding, obj._state.db = False, using
