"""The step engine on MySQL and MariaDB: a database per session, PyMySQL connections, InnoDB's lock waits.

Only a target of step scripts (the anomalies table runs Hermitage's suite on it): occviz's
own data stays on PostgreSQL. Each session's rows live in a fresh database of its own
(`occviz_step_<name>_<random>`, several occviz instances may share one server), dropped at
its end. Who waits for whom comes from information_schema.INNODB_LOCK_WAITS (MariaDB, MySQL
5.7) or performance_schema.data_lock_waits (MySQL 8), joined to INNODB_TRX for the
sessions' ids. A lock wait lasts at most `innodb_lock_wait_timeout`, set per session from
the step's lock timeout.

PyMySQL reports an error's number, not its SQLSTATE: the SQLSTATE is the server's for that
number (`SQLSTATES`; HY000, the server's own default, for the others), and the message
keeps the number ("1213: Deadlock found when trying to get lock; ...").
"""

from __future__ import annotations

import contextlib
import math
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import pymysql
from pymysql.constants import CLIENT

from occviz.steps.dialect import IDLE, IN_TRANSACTION, Result, Row, StepFailed
from occviz.steps.script import Delete, Insert, Select, SqlFlavor, Statement, Update, render

DATABASE_PREFIX = "occviz_step_"
MYSQL = SqlFlavor(share_lock="LOCK IN SHARE MODE", divide="DIV")
"""How MySQL spells a shared lock and PostgreSQL's integer division (`/` would give a decimal there)."""

DEADLOCK, LOCK_WAIT_TIMEOUT, QUERY_INTERRUPTED = 1213, 1205, 1317
SQLSTATES = {
    DEADLOCK: "40001",
    LOCK_WAIT_TIMEOUT: "HY000",
    QUERY_INTERRUPTED: "70100",
    1062: "23000",  # duplicate key
    1048: "23000",  # a column that cannot be null
    1146: "42S02",  # no such table
    1064: "42000",  # syntax
    1365: "22012",  # division by zero (in strict mode)
    1690: "22003",  # out of range
}
_LEVELS = {
    "read uncommitted": "READ UNCOMMITTED",
    "read committed": "READ COMMITTED",
    "repeatable read": "REPEATABLE READ",
    "serializable": "SERIALIZABLE",
}
_NAME = re.compile(r"^[a-z0-9_]{1,30}$")
_DATABASE = re.compile(r"^occviz_step_[a-z0-9_]{1,30}_[0-9a-f]{8}$")
_SELECTED = "id, value, version"
_CONNECT_TIMEOUT_S = 5
_WAITS_FRESH_S = 0.11


@dataclass(frozen=True)
class Server:
    """A MySQL-compatible server as a `mysql://user[:password]@host[:port][/]` URL names it."""

    host: str
    port: int
    user: str
    password: str

    @classmethod
    def from_url(cls, url: str) -> Server:
        """ValueError, worded, for anything but a mysql:// URL naming a host (no database: each run makes its own)."""
        parts = urlsplit(url.strip())
        if parts.scheme not in ("mysql", "mariadb"):
            raise ValueError(f"{url!r} is not a mysql:// URL (mysql://user@host:port/)")
        if not parts.hostname:
            raise ValueError(f"{url!r} names no host")
        if parts.path.strip("/") or parts.query or parts.fragment:
            raise ValueError(f"{url!r}: give the server only (each run makes and drops a database of its own)")
        try:
            port = parts.port or 3306
        except ValueError:
            raise ValueError(f"{url!r}: the port is not a number from 1 to 65535") from None
        return cls(parts.hostname, port, unquote(parts.username or "root"), unquote(parts.password or ""))

    @property
    def label(self) -> str:
        """The URL without its password, as pages show it."""
        return f"mysql://{self.user}@{self.host}:{self.port}/"

    def connect(self, database: str | None = None, **options: Any) -> pymysql.connections.Connection[Any]:
        # FOUND_ROWS: an update's row count is the rows it matched, as PostgreSQL counts them, not those it changed.
        return pymysql.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            database=database,
            autocommit=True,
            client_flag=CLIENT.FOUND_ROWS,
            connect_timeout=_CONNECT_TIMEOUT_S,
            **options,
        )


def same_server(url: str, allowed: Sequence[str]) -> bool:
    """Whether `url` names one of the `allowed` servers (host, port and user alike; a password must match too)."""
    try:
        wanted = Server.from_url(url)
    except ValueError:
        return False
    for entry in allowed:
        with contextlib.suppress(ValueError):
            if Server.from_url(entry) == wanted:
                return True
    return False


def flavor_of(version: str) -> str:
    """ "mariadb" or "mysql", from what `SELECT VERSION()` answers."""
    return "mariadb" if "mariadb" in version.lower() else "mysql"


def server_version(server: Server) -> str:
    """What the server's `SELECT VERSION()` says (pymysql's OperationalError if it does not answer)."""
    with server.connect() as conn, conn.cursor() as cursor:
        cursor.execute("SELECT VERSION()")
        (version,) = cursor.fetchone() or ("",)
    return str(version)


def _failed(error: pymysql.MySQLError) -> StepFailed:
    args: tuple[Any, ...] = tuple(error.args)
    if len(args) >= 2 and isinstance(args[0], int):
        number, message = args[0], str(args[1])
        return StepFailed(
            SQLSTATES.get(number, "HY000"),
            f"{number}: {message}",
            deadlock=number == DEADLOCK,
            lock_timeout=number == LOCK_WAIT_TIMEOUT,
        )
    return StepFailed(None, str(error))


def _rows(found: Sequence[tuple[Any, ...]]) -> list[Row]:
    return sorted(({"id": int(i), "value": int(v), "version": int(n)} for i, v, n in found), key=lambda row: row["id"])


class MySQLConnection:
    def __init__(self, server: Server, database: str, lock_timeout_s: float, returning: bool) -> None:
        self._server = server
        self._returning = returning
        self._conn = server.connect(database)
        try:
            with self._conn.cursor() as cursor:
                # Whole seconds only, at least one: a step waits that long at most for a row lock.
                cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {max(1, math.ceil(lock_timeout_s))}")
                cursor.execute("SELECT CONNECTION_ID(), @@innodb_rollback_on_timeout")
                backend, rollback_on_timeout = cursor.fetchone() or (0, 0)
        except BaseException:
            self._conn.close()
            raise
        self.backend = int(backend)
        self._rollback_on_timeout = bool(rollback_on_timeout)
        self._status = IDLE

    def _run(self, query: str) -> tuple[list[tuple[Any, ...]] | None, int]:
        try:
            with self._conn.cursor() as cursor:
                count = cursor.execute(query)
                return (list(cursor.fetchall()) if cursor.description is not None else None), int(count)
        except pymysql.err.OperationalError as error:
            if error.args and error.args[0] in (2006, 2013):  # the connection is gone: not the server's answer
                raise
            raise self._after(_failed(error)) from None
        except pymysql.MySQLError as error:
            raise self._after(_failed(error)) from None

    def _after(self, failed: StepFailed) -> StepFailed:
        """The transaction's state after an error: InnoDB rolls back a deadlock's victim whole, else the statement."""
        number = int(failed.message.split(":", 1)[0]) if failed.message[:4].isdigit() else None
        if number == DEADLOCK or (number == LOCK_WAIT_TIMEOUT and self._rollback_on_timeout):
            self._status = IDLE
        return failed

    def begin(self, isolation: str) -> None:
        # SET TRANSACTION applies to the next transaction only; START TRANSACTION inside one commits it first,
        # as a BEGIN would in the mysql client.
        self._run(f"SET TRANSACTION ISOLATION LEVEL {_LEVELS[isolation]}")
        self._run("START TRANSACTION")
        self._status = IN_TRANSACTION

    def commit(self) -> None:
        self._run("COMMIT")
        self._status = IDLE

    def abort(self) -> None:
        self._run("ROLLBACK")
        self._status = IDLE

    def execute(self, statement: Statement) -> Result:
        query = render(statement, MYSQL)
        if isinstance(statement, Select):
            found, _ = self._run(query)
            rows = _rows(found or [])
            return Result(rows, len(rows))
        if isinstance(statement, Insert | Delete) and self._returning:
            found, _ = self._run(f"{query} RETURNING {_SELECTED}")
            rows = _rows(found or [])
            return Result(rows, len(rows))
        if isinstance(statement, Update | Insert | Delete):
            # No RETURNING for an update here: the rows it wrote would take another statement inside the
            # transaction, which could move its snapshot. The count says how many it matched.
            _, count = self._run(query)
            return Result(None, count)
        raise ValueError(f"not a data statement: {statement!r}")

    def status(self) -> str:
        return self._status

    def cancel(self) -> None:
        # KILL QUERY from a session of its own: this one is busy with the statement to interrupt.
        with contextlib.suppress(pymysql.MySQLError), self._server.connect() as other, other.cursor() as cursor:
            cursor.execute(f"KILL QUERY {int(self.backend)}")

    def close(self) -> None:
        with contextlib.suppress(pymysql.MySQLError):
            self._conn.close()


# Who waits for whom, as the server can tell: MariaDB and MySQL 5.7 in information_schema, MySQL 8 in
# performance_schema. Both name transactions; INNODB_TRX maps them to the sessions' ids.
_WAITS = (
    """SELECT r.trx_mysql_thread_id, b.trx_mysql_thread_id
       FROM information_schema.INNODB_LOCK_WAITS w
       JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id
       JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id""",
    """SELECT r.trx_mysql_thread_id, b.trx_mysql_thread_id
       FROM performance_schema.data_lock_waits w
       JOIN information_schema.INNODB_TRX r ON r.trx_id = w.REQUESTING_ENGINE_TRANSACTION_ID
       JOIN information_schema.INNODB_TRX b ON b.trx_id = w.BLOCKING_ENGINE_TRANSACTION_ID""",
)


class MySQLObserver:
    def __init__(self, server: Server, database: str) -> None:
        self._conn = server.connect(database)
        self._waits: str | None = None
        self._read_at = -_WAITS_FRESH_S

    def committed(self) -> list[Row]:
        with self._conn.cursor() as cursor:
            # Autocommit: each read is a transaction of its own, so it sees what is committed now.
            cursor.execute(f"SELECT {_SELECTED} FROM test")
            return _rows(list(cursor.fetchall()))

    def waits(self, backends: Sequence[int]) -> dict[int, list[int]]:
        # InnoDB refreshes these tables only when they were last read more than 0.1 s ago: read more
        # often and they never change. Between two reads nothing is known yet (the engine asks again).
        now = time.monotonic()
        if not backends or now - self._read_at < _WAITS_FRESH_S:
            return {}
        self._read_at = now
        found: dict[int, list[int]] = {}
        for pid, blocker in self._lock_waits():
            if pid in backends and blocker not in found.setdefault(pid, []):
                found[pid].append(blocker)
        return found

    def _lock_waits(self) -> list[tuple[int, int]]:
        queries = [self._waits] if self._waits else list(_WAITS)
        last: pymysql.MySQLError | None = None
        for query in queries:
            try:
                with self._conn.cursor() as cursor:
                    cursor.execute(query)
                    pairs = [(int(r), int(b)) for r, b in cursor.fetchall()]
            except pymysql.err.ProgrammingError as missing:  # no such table on this server: the other place
                last = missing
                continue
            self._waits = query
            return pairs
        raise RuntimeError(f"the server shows no lock waits: {last}")

    def close(self) -> None:
        with contextlib.suppress(pymysql.MySQLError):
            self._conn.close()


STALE_AFTER_S = 12 * 3600
"""A step database older than this was left by a run that died: no run lasts so long."""


def drop_stale_databases(server: Server, older_than_s: float = STALE_AFTER_S) -> list[str]:
    """Drop the step databases whose table was made more than `older_than_s` ago (by the server's clock).

    Runs drop their database whatever happens; only a process killed outright leaves one. Several
    occviz instances may share the server, so age, not job ids, tells which are left over.
    """
    with server.connect() as conn, conn.cursor() as cursor:
        cursor.execute(
            "SELECT TABLE_SCHEMA FROM information_schema.TABLES WHERE TABLE_NAME = 'test' "
            "AND TABLE_SCHEMA LIKE %s AND CREATE_TIME < NOW() - INTERVAL %s SECOND",
            [DATABASE_PREFIX.replace("_", "\\_") + "%", int(older_than_s)],
        )
        stale = [str(name) for (name,) in cursor.fetchall() if _DATABASE.match(str(name))]
        for name in stale:
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
    return stale


class MySQLDialect:
    """Fresh rows in a database of their own on `server`, made by `create_rows` and dropped by `drop_rows`."""

    name = "mysql"

    def __init__(self, server: Server, name: str) -> None:
        if not _NAME.match(name):
            raise ValueError(f"a session's name is lower-case letters, digits and _: {name!r}")
        self.server = server
        # Random too: job ids repeat across occviz instances that share a server.
        self.database = f"{DATABASE_PREFIX}{name}_{secrets.token_hex(4)}"
        self.version = ""
        self._returning = False
        self._made = False

    @property
    def flavor(self) -> str:
        return flavor_of(self.version)

    def create_rows(self, rows: Sequence[tuple[int, int]]) -> None:
        with self.server.connect() as conn, conn.cursor() as cursor:
            cursor.execute("SELECT VERSION()")
            (version,) = cursor.fetchone() or ("",)
            self.version = str(version)
            # MariaDB returns the rows an insert or a delete wrote (10.5 on); MySQL does not.
            self._returning = self.flavor == "mariadb"
            cursor.execute(f"CREATE DATABASE `{self.database}`")
            self._made = True
            cursor.execute(
                f"CREATE TABLE `{self.database}`.test "
                "(id int PRIMARY KEY, value int NOT NULL, version int NOT NULL DEFAULT 1) ENGINE=InnoDB"
            )
            if rows:
                cursor.executemany(f"INSERT INTO `{self.database}`.test (id, value) VALUES (%s, %s)", list(rows))

    def drop_rows(self) -> None:
        if not self._made:
            return
        with self.server.connect() as conn, conn.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{self.database}`")
        self._made = False

    def connect(self, actor: str, lock_timeout_s: float) -> MySQLConnection:
        return MySQLConnection(self.server, self.database, lock_timeout_s, self._returning)

    def observe(self) -> MySQLObserver:
        return MySQLObserver(self.server, self.database)

    def sessions_left(self) -> int:
        """The server's sessions still on this session's database (none once every actor is closed)."""
        with self.server.connect() as conn, conn.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = %s", [self.database])
            (left,) = cursor.fetchone() or (0,)
        return int(left)

    def exists(self) -> bool:
        with self.server.connect() as conn, conn.cursor() as cursor:
            cursor.execute("SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", [self.database])
            return cursor.fetchone() is not None
