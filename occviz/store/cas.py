"""The one path that bumps a resource_version: compare_and_swap().

    UPDATE <table> SET <changes>, resource_version = resource_version + 1
    WHERE id = %s AND resource_version = %s
    RETURNING resource_version, ...

Zero rows updated is a conflict: someone else wrote since the caller read. The
scenarios, the admin and the API all write through here. The strategies that skip
the check (`none`'s blind write, `atomic`'s in-place increment) pass ANY as the
expected version, so even they move the version and the cost of skipping the
check stays visible.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from django.db import connections, models

ANY: Final = object()
"""Expected version that matches every version: a blind write."""


@dataclass(frozen=True, slots=True)
class Add:
    """A change computed by the database from the current value: `column = column + amount`."""

    amount: int


@functools.cache
def cas_statement(
    model: type[models.Model], columns: tuple[tuple[str, bool], ...], check_version: bool, returning: tuple[str, ...]
) -> str:
    meta = model._meta
    sets = []
    for name, is_add in columns:
        column = _field(model, name).column
        sets.append(f'"{column}" = "{column}" + %s' if is_add else f'"{column}" = %s')
    sets.append('"resource_version" = "resource_version" + 1')
    where = f'"{meta.pk.column}" = %s'
    if check_version:
        where += ' AND "resource_version" = %s'
    returned = ", ".join(f'"{_field(model, name).column}"' for name in returning)
    return f'UPDATE "{meta.db_table}" SET {", ".join(sets)} WHERE {where} RETURNING {returned}'


def compare_and_swap(
    model: type[models.Model],
    pk: Any,
    expected_version: int | object,
    changes: Mapping[str, Any],
    *,
    returning: Sequence[str] = ("resource_version",),
    cursor: Any = None,
    using: str = "default",
) -> tuple[Any, ...] | None:
    """Apply `changes` to row `pk` if its version is `expected_version`.

    Returns the `returning` columns after the write (the new resource_version
    first by default), or None when no row matched: a conflict. `cursor` lets a
    hot loop reuse its cursor (a Django cursor, or a writer's PreparedSession);
    its `db` is the connection the values are prepared for.
    """
    columns = tuple((name, isinstance(value, Add)) for name, value in changes.items())
    check_version = expected_version is not ANY
    sql = cas_statement(model, columns, check_version, tuple(returning))  # type: ignore[arg-type]
    connection = cursor.db if cursor is not None else connections[using]
    params: list[Any] = [
        value.amount if isinstance(value, Add) else _field(model, name).get_db_prep_save(value, connection)
        for name, value in changes.items()
    ]
    params.append(pk)
    if check_version:
        params.append(expected_version)
    if cursor is not None:
        cursor.execute(sql, params)
        return cursor.fetchone()
    with connection.cursor() as own_cursor:
        own_cursor.execute(sql, params)
        return own_cursor.fetchone()


_fields: dict[tuple[type[models.Model], str], Any] = {}


def _field(model: type[models.Model], name: str) -> Any:
    """model._meta.get_field, remembered: it runs on every write of the hot loop."""
    key = (model, name)
    if key not in _fields:
        _fields[key] = model._meta.get_field(name)
    return _fields[key]
