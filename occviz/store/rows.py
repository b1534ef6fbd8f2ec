"""Rows read and inserted by statements made once per model and database, for a hot path.

`Model.save()`, Django's `InsertQuery` and a queryset build their SQL anew for every row,
and a queryset makes a model of every field it reads: a web process answering a class's
presses pays for that on the cores the job's writers use. A statement of one's own names
the columns (`fields_to_insert`, `columns_of`), has each row's values prepared as `save()`
prepares them (`values_of`), and `from_row` makes the model a queryset would make of a row
from the columns it selected.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from django.db import connections, models
from django.db.backends.base.base import BaseDatabaseWrapper


@functools.cache
def fields_to_insert(model: type[models.Model], with_pk: bool) -> tuple[models.Field[Any, Any], ...]:
    """The concrete fields an INSERT of `model` names, in order (its primary key first, if `with_pk`)."""
    return tuple(field for field in model._meta.concrete_fields if with_pk or not field.primary_key)


def fields_named(model: type[models.Model], *names: str) -> tuple[models.Field[Any, Any], ...]:
    """The concrete fields of `model` named, in that order (a statement's columns, for `columns_of` and `from_row`)."""
    return tuple(cast(models.Field[Any, Any], model._meta.get_field(name)) for name in names)


def columns_of(
    fields: Sequence[models.Field[Any, Any]], connection: BaseDatabaseWrapper, table: str | None = None
) -> str:
    """The fields' columns, quoted, comma-separated (each of `table`, if named): an INSERT's or a SELECT's list."""
    quote = connection.ops.quote_name
    qualifier = f"{quote(table)}." if table else ""
    return ", ".join(f"{qualifier}{quote(cast(str, field.column))}" for field in fields)


def values_of(
    obj: models.Model, fields: tuple[models.Field[Any, Any], ...], connection: BaseDatabaseWrapper
) -> list[Any]:
    """`obj`'s values for `fields`, prepared as `save()` prepares a new row's (defaults, auto_now_add...)."""
    return [field.get_db_prep_save(field.pre_save(obj, add=True), connection) for field in fields]


def from_row[M: models.Model](
    model: type[M], db: str, fields: Sequence[models.Field[Any, Any]], row: Sequence[Any]
) -> M:
    """The model a query makes of `row` (the columns of `fields`, in order), converted as a query converts them.

    Fields not among `fields` are deferred, as `only()` leaves them.
    """
    connection = connections[db]
    reading = _reading(model, tuple(fields), db)
    values = []
    for (column, converters), value in zip(reading.converters, row, strict=True):
        for convert in converters:
            value = convert(value, column, connection)
        values.append(value)
    return model.from_db(db, reading.attnames, [values[n] for n in reading.order])


@dataclass(frozen=True)
class _Reading:
    """How `from_row` reads one shape of row: each column's conversions, and the model's order of the fields."""

    converters: tuple[tuple[Any, tuple[Any, ...]], ...]
    attnames: list[str]
    order: tuple[int, ...]


@functools.cache
def _reading(model: type[models.Model], fields: tuple[models.Field[Any, Any], ...], db: str) -> _Reading:
    connection = connections[db]
    converters = []
    for field in fields:
        column = field.get_col(model._meta.db_table)
        # What a query would do to each value: the backend's conversions, then the field's (JSON text to objects).
        converters.append((column, (*connection.ops.get_db_converters(column), *field.get_db_converters(connection))))
    # from_db takes the values of a subset in the model's order.
    position = {field: n for n, field in enumerate(model._meta.concrete_fields)}
    order = tuple(sorted(range(len(fields)), key=lambda n: position[fields[n]]))
    return _Reading(tuple(converters), [fields[n].attname for n in order], order)
