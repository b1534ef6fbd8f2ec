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

Given a hub (occviz.concurrency.hub: many actors as greenlets of one thread), the session
sends each statement without blocking and lets the hub run the other actors until its
socket has the answer; without one it blocks in libpq, the interpreter lock released.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

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


class Hub(Protocol):
    """What a session waits on instead of blocking (occviz.concurrency.hub.Hub is one)."""

    def wait_fd(self, fd: int, *, writable: bool = False) -> None:
        """Return once socket `fd` can be read (or written), the hub running other work meanwhile."""
        ...

    def forget_fd(self, fd: int) -> None: ...


class PreparedSession:
    """`one(sql, params)` with %s placeholders: a prepared statement's first row; `execute` for the rest.

    `overrides` replace the alias' connection parameters, e.g. `host=` to connect
    through another socket (a proxy) to the same database.
    """

    def __init__(self, using: str = "default", *, hub: Hub | None = None, **overrides: Any) -> None:
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
        self._hub = hub
        if self._hub is not None:
            self._pgconn.nonblocking = 1

    def _prepare(self, sql: str) -> _Statement:
        name = f"occviz_{len(self._statements)}".encode()
        counter = iter(range(1, 1000))
        native = _PLACEHOLDER.sub(lambda _: f"${next(counter)}", sql)
        if self._hub is None:
            check(self._pgconn.prepare(name, native.encode()))
            described = check(self._pgconn.describe_prepared(name))
        else:
            self._pgconn.send_prepare(name, native.encode())
            check(self._answer(self._hub))
            self._pgconn.send_describe_prepared(name)
            described = check(self._answer(self._hub))
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
        if self._hub is None:
            result = check(self._pgconn.exec_prepared(statement.name, values, statement.formats))  # type: ignore[arg-type]
        else:
            self._pgconn.send_query_prepared(statement.name, values, statement.formats)
            result = check(self._answer(self._hub))
        if not result.ntuples:
            return None
        transformer.set_pgresult(result, set_loaders=False)
        return transformer.load_row(0, tuple)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        if params:
            self.one(sql, params)
        elif self._hub is None:
            check(self._pgconn.exec_(sql.encode()))
        else:
            self._pgconn.send_query(sql.encode())
            check(self._answer(self._hub))

    def _answer(self, hub: Hub) -> pq.abc.PGresult:
        """The statement just sent: its result, the hub running the other actors while the server works."""
        pgconn, fd = self._pgconn, self._pgconn.socket
        while pgconn.flush():
            hub.wait_fd(fd, writable=True)
        first = None
        while True:
            while pgconn.is_busy():
                hub.wait_fd(fd)
                pgconn.consume_input()
            result = pgconn.get_result()
            if result is None:
                break
            if first is None or result.status == pq.ExecStatus.FATAL_ERROR:
                first = result
        if first is None:
            raise psycopg.OperationalError("the server sent no result")
        return first

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
        if self._hub is not None:
            self._hub.forget_fd(self._pgconn.socket)
        self._conn.close()
