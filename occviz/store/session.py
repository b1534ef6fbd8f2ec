"""A writer's own database session: prepared statements straight over libpq.

A job's writers are threads of one process on a two-core machine; on a hot row the
time each spends in Python between statements is time the row sits idle. Django's
cursor does more Python per statement than the race can afford, so a writer runs
its SQL here instead: each statement is prepared once per connection, then sent
with PQexecPrepared, which releases the interpreter lock while it waits. The SQL
is unchanged: a `Swap` (occviz.store.cas) builds it and runs it on this session.

Values cross through psycopg's own adapters. A prepared statement's parameter and
column types never change, so each statement gets a Transformer whose dumpers are
chosen by the parameter types the server inferred (a dict or list bound to a jsonb
parameter goes as jsonb, an int to a bigint as int8, ...) and whose loaders by its
column types (timestamptz comes back as an aware datetime in the session's time
zone, Django's, UTC by default).

The session owns a connection of its own in autocommit mode; `transaction()`
issues BEGIN / COMMIT / ROLLBACK itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connections
from psycopg import abc, pq
from psycopg.adapt import Transformer

_PLACEHOLDER = re.compile(r"%s")


def check(result: pq.abc.PGresult) -> pq.abc.PGresult:
    """`result`, or the psycopg error (by SQLSTATE, as psycopg raises them) if the statement failed."""
    if result.status == pq.ExecStatus.FATAL_ERROR:
        sqlstate = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
        message = result.get_error_message().strip()
        raise psycopg.errors.lookup(sqlstate or "XX000")(message, info=result)
    return result


@dataclass(frozen=True, slots=True)
class _Statement:
    """A statement prepared on the session's connection, with the adapters for its types."""

    name: bytes
    transformer: abc.Transformer
    formats: Sequence[pq.Format]


class PreparedSession:
    """`one(sql, params)` with %s placeholders: a prepared statement's first row; `execute` for the rest.

    `overrides` replace the alias' connection parameters, e.g. `host=` to connect
    through another socket (a proxy) to the same database.
    """

    def __init__(self, using: str = "default", **overrides: Any) -> None:
        self.db = connections[using]  # what compare_and_swap prepares values for
        params = self.db.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)  # Django's adapters load jsonb as text; this session loads it as psycopg does
        params.update(overrides)
        self._conn = psycopg.connect(**params, autocommit=True)
        # Datetimes come back in the session's time zone: make it the one Django reads them in.
        self._conn.execute(self.db.ops.set_time_zone_sql(), [self.db.timezone_name])
        self._pgconn = self._conn.pgconn
        self._statements: dict[str, _Statement] = {}

    def _prepare(self, sql: str) -> _Statement:
        name = f"occviz_{len(self._statements)}".encode()
        counter = iter(range(1, 1000))
        native = _PLACEHOLDER.sub(lambda _: f"${next(counter)}", sql)
        check(self._pgconn.prepare(name, native.encode()))
        described = check(self._pgconn.describe_prepared(name))
        transformer = Transformer(self._conn)
        transformer.set_dumper_types([described.param_type(i) for i in range(described.nparams)], pq.Format.BINARY)
        transformer.set_loader_types([described.ftype(i) for i in range(described.nfields)], pq.Format.TEXT)
        statement = self._statements[sql] = _Statement(name, transformer, transformer.formats or ())
        return statement

    def one(self, sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
        """Run `sql` as a prepared statement; its first row, or None. The hot loop's one call a statement."""
        statement = self._statements.get(sql) or self._prepare(sql)
        transformer = statement.transformer
        # The statement's dumpers were chosen by its parameter types, so `formats` (by Python type) is unused.
        # Ints need no path of their own: these dumpers, in C and chosen once, cost less than str(n).encode().
        values = transformer.dump_sequence(params, ())
        # A None goes as NULL, though psycopg's type for exec_prepared leaves it out.
        result = check(self._pgconn.exec_prepared(statement.name, values, statement.formats))  # type: ignore[arg-type]
        if not result.ntuples:
            return None
        transformer.set_pgresult(result, set_loaders=False)
        return transformer.load_row(0, tuple)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        if params:
            self.one(sql, params)
        else:
            check(self._pgconn.exec_(sql.encode()))

    @contextmanager
    def transaction(self, isolation: str = "") -> Iterator[None]:
        """BEGIN [ISOLATION LEVEL ...]; COMMIT if the block succeeds, ROLLBACK if it raises."""
        self.execute(f"BEGIN ISOLATION LEVEL {isolation}" if isolation else "BEGIN")
        try:
            yield
        except BaseException:
            self.execute("ROLLBACK")
            raise
        self.execute("COMMIT")

    def close(self) -> None:
        self._conn.close()
