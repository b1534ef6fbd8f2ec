"""The step engine on PostgreSQL: a schema per session, psycopg connections, `pg_blocking_pids` for who waits.

Each session's rows live in a schema of its own (`occviz_step_<name>`), and every actor's
connection has its `search_path` set to it, so a step's `test` is that schema's table and
nothing else. Writes are sent with `RETURNING id, value, version`: what an actor wrote is
known without another statement inside its transaction.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import pq, sql

from occviz.steps.dialect import FAILED, IDLE, IN_TRANSACTION, Result, Row, StepFailed
from occviz.steps.script import Delete, Insert, Select, Statement, Update, render

SCHEMA_PREFIX = "occviz_step_"
_NAME = re.compile(r"^[a-z0-9_]{1,40}$")
_LEVELS = {
    "read uncommitted": "READ UNCOMMITTED",
    "read committed": "READ COMMITTED",
    "repeatable read": "REPEATABLE READ",
    "serializable": "SERIALIZABLE",
}
_RETURNING = " RETURNING id, value, version"


def _rows(found: Sequence[tuple[Any, ...]]) -> list[Row]:
    return sorted(({"id": i, "value": v, "version": n} for i, v, n in found), key=lambda row: row["id"])


def _failed(error: psycopg.Error) -> StepFailed:
    message = error.diag.message_primary or str(error).strip()
    return StepFailed(error.sqlstate, message)


class PostgresConnection:
    def __init__(self, conninfo: Mapping[str, Any], schema: str, actor: str, lock_timeout_s: float) -> None:
        self._conn = psycopg.connect(**conninfo, autocommit=True)
        try:
            self._conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
            self._conn.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(f"{int(lock_timeout_s * 1000)}ms")))
            self._conn.execute(sql.SQL("SET application_name = {}").format(sql.Literal(f"{schema} {actor}"[:63])))
        except BaseException:
            self._conn.close()
            raise
        self.backend = self._conn.info.backend_pid

    def _run(self, query: str | sql.Composed) -> list[tuple[Any, ...]] | None:
        try:
            with self._conn.cursor() as cursor:
                cursor.execute(query)
                return cursor.fetchall() if cursor.description is not None else None
        except psycopg.Error as error:
            if error.sqlstate is None:
                raise  # not the database's answer (a lost connection): the engine reports it as it is
            raise _failed(error) from None

    def begin(self, isolation: str) -> None:
        self._run(f"BEGIN ISOLATION LEVEL {_LEVELS[isolation]}")

    def commit(self) -> None:
        self._run("COMMIT")

    def abort(self) -> None:
        self._run("ROLLBACK")

    def execute(self, statement: Statement) -> Result:
        query = render(statement)
        if isinstance(statement, Update | Insert | Delete):
            query += _RETURNING
        elif not isinstance(statement, Select):
            raise ValueError(f"not a data statement: {statement!r}")
        found = self._run(query) or []
        return Result(_rows(found), len(found))

    def status(self) -> str:
        status = self._conn.info.transaction_status
        if status == pq.TransactionStatus.INERROR:
            return FAILED
        return IN_TRANSACTION if status in (pq.TransactionStatus.INTRANS, pq.TransactionStatus.ACTIVE) else IDLE

    def cancel(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self._conn.cancel_safe(timeout=5.0)

    def close(self) -> None:
        self._conn.close()


class PostgresObserver:
    def __init__(self, conninfo: Mapping[str, Any], schema: str) -> None:
        self._conn = psycopg.connect(**conninfo, autocommit=True)
        self._conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
        self._conn.execute(sql.SQL("SET application_name = {}").format(sql.Literal(f"{schema} observer"[:63])))

    def committed(self) -> list[Row]:
        return _rows(self._conn.execute("SELECT id, value, version FROM test").fetchall())

    def waits(self, backends: Sequence[int]) -> dict[int, list[int]]:
        found = self._conn.execute(
            "SELECT pid, pg_blocking_pids(pid) FROM unnest(%s::int[]) AS pid", [list(backends)]
        ).fetchall()
        return {pid: list(blockers) for pid, blockers in found if blockers}

    def close(self) -> None:
        self._conn.close()


class PostgresDialect:
    """Fresh rows in schema `occviz_step_<name>` of the database `conninfo` (psycopg.connect's arguments) names."""

    name = "postgresql"

    def __init__(self, conninfo: Mapping[str, Any], name: str) -> None:
        if not _NAME.match(name):
            raise ValueError(f"a session's name is lower-case letters, digits and _: {name!r}")
        self.conninfo = dict(conninfo)
        self.schema = SCHEMA_PREFIX + name

    def _admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(**self.conninfo, autocommit=True)

    def create_rows(self, rows: Sequence[tuple[int, int]]) -> None:
        schema = sql.Identifier(self.schema)
        with self._admin() as conn, conn.transaction():
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {}.test (id int PRIMARY KEY, value int NOT NULL, version int NOT NULL DEFAULT 1)"
                ).format(schema)
            )
            if rows:
                with conn.cursor() as cursor:
                    cursor.executemany(
                        sql.SQL("INSERT INTO {}.test (id, value) VALUES (%s, %s)").format(schema), list(rows)
                    )

    def drop_rows(self) -> None:
        drop_schema(self.conninfo, self.schema)

    def connect(self, actor: str, lock_timeout_s: float) -> PostgresConnection:
        return PostgresConnection(self.conninfo, self.schema, actor, lock_timeout_s)

    def observe(self) -> PostgresObserver:
        return PostgresObserver(self.conninfo, self.schema)


def drop_schema(conninfo: Mapping[str, Any], schema: str) -> None:
    if not schema.startswith(SCHEMA_PREFIX):
        raise ValueError(f"not a step session's schema: {schema!r}")
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def session_schemas(conninfo: Mapping[str, Any]) -> list[str]:
    """The step sessions' schemas in the database now (a session ended by a crash leaves its schema behind)."""
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        found = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s) ORDER BY nspname", [SCHEMA_PREFIX]
        ).fetchall()
    return [name for (name,) in found]
