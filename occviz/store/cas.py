"""The one path that bumps a resource_version: compare_and_swap(), and the Swap it runs.

    UPDATE <table> SET <changes>, resource_version = resource_version + 1
    WHERE id = %s AND resource_version = %s
    RETURNING resource_version, ...

Zero rows updated is a conflict: someone else wrote since the caller read. The
scenarios, the admin and the API all write through here. The strategies that skip
the check (`none`'s blind write, `atomic`'s in-place increment) pass ANY as the
expected version, so even they move the version and the cost of skipping the
check stays visible. A hot loop takes its Swap once (`swap_for`) and runs it per write.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from django.db import connections, models

from occviz.store.session import PreparedSession

ANY: Final = object()
"""Expected version that matches every version: a blind write."""


@dataclass(frozen=True, slots=True)
class Add:
    """A change computed by the database from the current value: `column = column + amount`."""

    amount: int


class Swap:
    """One shape of compare-and-swap (which columns, checked or blind, what comes back), built once.

    A hot loop takes its Swap once (`swap_for`) and calls `run` for every write: the SQL
    is built and the fields looked up here, not on each call.
    """

    __slots__ = ("_integer", "_is_add", "check_version", "fields", "sql")

    def __init__(
        self,
        model: type[models.Model],
        columns: tuple[tuple[str, bool], ...],
        check_version: bool,
        returning: tuple[str, ...],
    ) -> None:
        meta = model._meta
        self.fields = tuple(meta.get_field(name) for name, _ in columns)
        self._is_add = tuple(is_add for _, is_add in columns)
        # A plain int bound for an integer column needs none of Django's preparation.
        self._integer = tuple(isinstance(field, models.IntegerField) for field in self.fields)
        self.check_version = check_version
        sets = [
            f'"{field.column}" = "{field.column}" + %s' if is_add else f'"{field.column}" = %s'
            for field, is_add in zip(self.fields, self._is_add, strict=True)
        ]
        sets.append('"resource_version" = "resource_version" + 1')
        where = f'"{meta.pk.column}" = %s'
        if check_version:
            where += ' AND "resource_version" = %s'
        returned = ", ".join(f'"{meta.get_field(name).column}"' for name in returning)
        self.sql = f'UPDATE "{meta.db_table}" SET {", ".join(sets)} WHERE {where} RETURNING {returned}'

    def run(
        self, pk: Any, expected_version: Any, values: Iterable[Any], *, cursor: Any = None, using: str = "default"
    ) -> tuple[Any, ...] | None:
        """Write `values` (in this Swap's column order); the returned columns, or None on a conflict."""
        connection = cursor.db if cursor is not None else connections[using]
        params: list[Any] = []
        for value, field, is_add, integer in zip(values, self.fields, self._is_add, self._integer, strict=True):
            if is_add:
                params.append(value.amount)
            elif integer and type(value) is int:
                params.append(value)
            else:
                params.append(field.get_db_prep_save(value, connection))
        params.append(pk)
        if self.check_version:
            params.append(expected_version)
        if isinstance(cursor, PreparedSession):
            return cursor.one(self.sql, params)
        if cursor is not None:
            cursor.execute(self.sql, params)
            return cursor.fetchone()
        with connection.cursor() as own_cursor:
            own_cursor.execute(self.sql, params)
            return own_cursor.fetchone()


@functools.cache
def swap_for(
    model: type[models.Model],
    columns: tuple[tuple[str, bool], ...],
    check_version: bool,
    returning: tuple[str, ...] = ("resource_version",),
) -> Swap:
    """The Swap for writing `columns` ((name, is Add) pairs) of `model`, checked against a version or not."""
    return Swap(model, columns, check_version, returning)


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
    swap = swap_for(model, columns, expected_version is not ANY, tuple(returning))  # type: ignore[arg-type]
    return swap.run(pk, expected_version, changes.values(), cursor=cursor, using=using)
