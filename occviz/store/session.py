"""A writer's own database session: prepared statements straight over libpq.

A job's writers are threads of one process on a two-core machine. On a hot row,
every commit wakes all the losers at once and each needs the interpreter lock to
read its result and send its next statement; the time they spend in Python is
time the row sits idle. Django's cursor costs about 110 us of Python per
statement, this session about 40 us (each statement is prepared once per
connection, then sent with PQexecPrepared, which releases the lock while it
waits). The SQL is unchanged: a `Swap` (occviz.store.cas) builds it and runs it
on this session.

The session owns a connection of its own in autocommit mode; `transaction()`
issues BEGIN / COMMIT / ROLLBACK itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connections
from psycopg import pq

_PLACEHOLDER = re.compile(r"%s")
_INTEGER_OIDS = {20, 21, 23, 26}  # int8, int2, int4, oid
_BOOL_OID = 16


def _encode(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, (int, float, str)):
        return str(value).encode()
    if isinstance(value, dict | list):
        return json.dumps(value).encode()
    raise TypeError(f"cannot send {type(value).__name__} as a statement parameter")


def check(result: pq.abc.PGresult) -> pq.abc.PGresult:
    """`result`, or the psycopg error (by SQLSTATE, as psycopg raises them) if the statement failed."""
    if result.status == pq.ExecStatus.FATAL_ERROR:
        sqlstate = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
        message = result.get_error_message().strip()
        raise psycopg.errors.lookup(sqlstate or "XX000")(message, info=result)
    return result


def _decoder(oid: int) -> Callable[[bytes], Any]:
    if oid in _INTEGER_OIDS:
        return int
    if oid == _BOOL_OID:
        return b"t".__eq__
    return bytes.decode


class PreparedSession:
    """`one(sql, params)` with %s placeholders: a prepared statement's first row; `execute` for the rest."""

    def __init__(self, using: str = "default") -> None:
        self.db = connections[using]  # what compare_and_swap prepares values for
        params = self.db.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        self._conn = psycopg.connect(**params, autocommit=True)
        self._pgconn = self._conn.pgconn
        self._prepared: dict[str, bytes] = {}
        self._decoders: dict[bytes, list[Callable[[bytes], Any]]] = {}

    def _statement(self, sql: str) -> bytes:
        name = self._prepared.get(sql)
        if name is None:
            name = f"occviz_{len(self._prepared)}".encode()
            counter = iter(range(1, 1000))
            native = _PLACEHOLDER.sub(lambda _: f"${next(counter)}", sql)
            check(self._pgconn.prepare(name, native.encode()))
            self._prepared[sql] = name
        return name

    def one(self, sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
        """Run `sql` as a prepared statement; its first row, or None. The hot loop's one call a statement."""
        name = self._prepared.get(sql) or self._statement(sql)
        result = self._pgconn.exec_prepared(name, [str(p).encode() if type(p) is int else _encode(p) for p in params])  # type: ignore[misc]
        result = check(result)
        if not result.ntuples:
            return None
        decoders = self._decoders.get(name)
        if decoders is None:  # a prepared statement's result columns never change type
            decoders = self._decoders[name] = [_decoder(result.ftype(column)) for column in range(result.nfields)]
        raw = [result.get_value(0, column) for column in range(len(decoders))]
        return tuple([None if value is None else decode(value) for value, decode in zip(raw, decoders, strict=True)])

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
