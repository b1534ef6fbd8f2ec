"""The one path that bumps a resource_version: compare_and_swap(), and the Swap it runs.

    UPDATE <table> SET <changes>, resource_version = resource_version + 1
    WHERE id = %s AND resource_version = %s
    RETURNING resource_version, ...

Zero rows updated is a conflict: someone else wrote since the caller read. The
scenarios, the admin and the API all write through here. The strategies that skip
the check (`none`'s blind write, `atomic`'s in-place increment) pass ANY as the
expected version, so even they move the version and the cost of skipping the
check stays visible. A hot loop takes its Swap once (`swap_for`) and runs it per write.
A writer that logs what it overwrote (the admin's, the API's: `occviz.store.writes`) runs the
same SET in a statement that also locks the row and logs the write (`occviz.store.statements`).

A change is a value, an `Add` computed by the database from the current value, or
`NOW`, the database's clock at the write. `NOW` in `returning` returns that clock
too, so a caller can tell by one clock, the database's, when each write happened.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from django.core.exceptions import FieldDoesNotExist
from django.db import connections, models
from django.db.models.options import Options

from occviz.store.session import PreparedSession

ANY: Final = object()
"""Expected version that matches every version: a blind write."""


@dataclass(frozen=True, slots=True)
class Add:
    """A change computed by the database from the current value: `column = column + amount`."""

    amount: int


@dataclass(frozen=True, slots=True)
class Now:
    """The database's clock when the row is written: `clock_timestamp()`.

    Not `now()`, which is the start of the transaction: a write that waited for a lock
    would be dated before the write it waited for.
    """


NOW: Final = Now()
"""As a change, `column = clock_timestamp()`; in `returning`, the clock_timestamp() of the write.

Each clock_timestamp() is read anew: for exactly the time a NOW change wrote, return its column.
"""

_CLOCK_SQL = "clock_timestamp()"

# How a Swap binds each column's value (see Swap.run).
_PREPARED: Final = "prepared"  # Django's get_db_prep_save, for the swap's connection
_INTEGER: Final = "integer"  # a plain int for an integer column goes as it is, unprepared
_ADD: Final = "add"  # the Add's amount
_CLOCK: Final = "clock"  # nothing: the SQL says clock_timestamp()


def _column(meta: Options[Any], name: str) -> models.Field[Any, Any]:
    """The field `name` of a model: a column of its table, never a relation pointing at it."""
    field = meta.get_field(name)
    if not isinstance(field, models.Field):
        raise FieldDoesNotExist(f"{meta.label}.{name} is a reverse relation, not a column")
    return field


def _binding(field: models.Field[Any, Any], how: bool | Now) -> str:
    if isinstance(how, Now):
        return _CLOCK
    if how:
        return _ADD
    return _INTEGER if isinstance(field, models.IntegerField) else _PREPARED


class Swap:
    """One shape of compare-and-swap (which columns, checked or blind, what comes back), built once.

    A hot loop takes its Swap once (`swap_for`) and calls `run` for every write: the SQL
    is built and the fields looked up here, not on each call.
    """

    __slots__ = ("_binds", "assignments", "check_version", "fields", "sql")

    def __init__(
        self,
        model: type[models.Model],
        columns: tuple[tuple[str, bool | Now], ...],
        check_version: bool,
        returning: tuple[str | Now, ...],
    ) -> None:
        meta = model._meta
        self.fields = tuple(_column(meta, name) for name, _ in columns)
        self._binds = tuple(_binding(field, how) for field, (_, how) in zip(self.fields, columns, strict=True))
        self.check_version = check_version
        sets = []
        table = f'"{meta.db_table}"'
        # The right-hand side names the table's column: a statement that joins another row source (store.statements) may
        # have a column of the same name.
        for field, bind in zip(self.fields, self._binds, strict=True):
            column = f'"{field.column}"'
            if bind is _ADD:
                sets.append(f"{column} = {table}.{column} + %s")
            elif bind is _CLOCK:
                sets.append(f"{column} = {_CLOCK_SQL}")
            else:
                sets.append(f"{column} = %s")
        sets.append(f'"resource_version" = {table}."resource_version" + 1')
        self.assignments = ", ".join(sets)
        """The SET clause: the changes, and the version moved on."""
        where = f'"{meta.pk.column}" = %s'
        if check_version:
            where += ' AND "resource_version" = %s'
        returned = ", ".join(
            _CLOCK_SQL if isinstance(name, Now) else f'"{_column(meta, name).column}"' for name in returning
        )
        self.sql = f"UPDATE {table} SET {self.assignments} WHERE {where} RETURNING {returned}"

    def run(
        self, pk: Any, expected_version: Any, values: Iterable[Any], *, cursor: Any = None, using: str = "default"
    ) -> tuple[Any, ...] | None:
        """Write `values` (in this Swap's column order); the returned columns, or None on a conflict."""
        connection = cursor.db if cursor is not None else connections[using]
        params = self.assigned(values, connection)
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

    def assigned(self, values: Iterable[Any], connection: Any) -> list[Any]:
        """The parameters of `assignments` for `values` (in this Swap's column order), prepared for `connection`."""
        params: list[Any] = []
        for value, field, bind in zip(values, self.fields, self._binds, strict=True):
            if bind is _INTEGER and type(value) is int:
                params.append(value)
            elif bind is _ADD:
                params.append(value.amount)
            elif bind is not _CLOCK:
                params.append(field.get_db_prep_save(value, connection))
        return params


@functools.cache
def swap_for(
    model: type[models.Model],
    columns: tuple[tuple[str, bool | Now], ...],
    check_version: bool,
    returning: tuple[str | Now, ...] = ("resource_version",),
) -> Swap:
    """The Swap for writing `columns` of `model`, checked against a version or not.

    `columns` are (name, how) pairs: False for a value, True for an Add, NOW for the database's clock.
    """
    return Swap(model, columns, check_version, returning)


def shape_of(changes: Mapping[str, Any]) -> tuple[tuple[str, bool | Now], ...]:
    return tuple((name, value if isinstance(value, Now) else isinstance(value, Add)) for name, value in changes.items())


def compare_and_swap(
    model: type[models.Model],
    pk: Any,
    expected_version: int | object,
    changes: Mapping[str, Any],
    *,
    returning: Sequence[str | Now] = ("resource_version",),
    cursor: Any = None,
    using: str = "default",
) -> tuple[Any, ...] | None:
    """Apply `changes` to row `pk` if its version is `expected_version`.

    Returns the `returning` columns after the write (the new resource_version
    first by default; NOW for the database's clock at the write), or None when no
    row matched: a conflict. `cursor` lets a hot loop reuse its cursor (a Django
    cursor, or a writer's PreparedSession); its `db` is the connection the values
    are prepared for.
    """
    swap = swap_for(model, shape_of(changes), expected_version is not ANY, tuple(returning))
    return swap.run(pk, expected_version, changes.values(), cursor=cursor, using=using)
