"""Database work of the websockets, off the one thread every socket shares, in threads of its own.

Channels' `database_sync_to_async` runs each call in ONE thread per process (a websocket has
no request context of its own, so every call is "thread sensitive" to the same thread): the
session load of every handshake, every job row read, every feed's read of a new batch. A
viewer that joins a long job at seq 0 reads hundreds of pages of history; in that thread,
every other socket's handshake waited behind them, past Daphne's 5 s handshake timeout.

So three kinds of work get threads of their own, each thread with its own database connection:

- history reads (`read_history`): a viewer catching up on a job from the store. At most
  HISTORY_THREADS at once per process, the rest queued in order (one page a request, so
  viewers reading long histories take turns page by page).
- handshakes (`read_for_handshake`): the session and user of a new socket, and its job's row.
  They wait behind other handshakes only, never behind a history or a feed.
- presses (`run_for_socket`): a student's +1 sent over their socket, its read and then its
  short write transaction, behind other presses only.

A thread closes its connection (returns it to the pool, when one is configured) once it has
had no work for IDLE_S, so an idle process holds none, and a burst of new sockets does not
open one per read. A read whose viewer left (its task
cancelled when the socket closed) is dropped if it has not started, and if it has, its
running statement is cancelled in PostgreSQL; STATEMENT_TIMEOUT_MS stops any that still runs
too long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import psycopg
from django.db import DatabaseError, connection

logger = logging.getLogger(__name__)

# History reads at once in a web process; on a two-core machine PostgreSQL does the rest of the work.
HISTORY_THREADS = 3
# Handshakes' reads at once: each is a few small queries.
HANDSHAKE_THREADS = 2
# Students' presses sent over their sockets at once: each a read, then a short write transaction.
PRESS_THREADS = 2
# A page of history or a handshake's read takes milliseconds; a statement running longer is cancelled by PostgreSQL.
STATEMENT_TIMEOUT_MS = 10_000
# A thread that had no work for this long closes its connection (a burst of sockets reuses it).
IDLE_S = 2.0
# How long a cancel request may take to reach PostgreSQL.
CANCEL_TIMEOUT_S = 2.0


class _Read:
    """One read handed to the threads: the function, where its result goes, and who runs it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.loop = loop
        self.fn = fn
        self.args = args
        self.future: asyncio.Future[Any] = loop.create_future()
        self.lock = threading.Lock()
        self.cancelled = False
        self.running_on: Any = None
        """The psycopg connection running its statements, while it runs."""
        self.cancel_sent = False
        """A cancel request went to PostgreSQL: it may still land, so the connection is not used again."""

    def start(self) -> bool:
        with self.lock:
            if self.cancelled:
                return False
            self.running_on = connection.connection
            return True

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        with self.lock:
            self.running_on = None
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            self.loop.call_soon_threadsafe(self._deliver, result, error)

    def _deliver(self, result: Any, error: BaseException | None) -> None:
        if self.future.done():
            return
        if error is None:
            self.future.set_result(result)
        else:
            self.future.set_exception(error)

    def cancel(self) -> None:
        """Drop the read, or stop its running statement (in a thread: a cancel request is a round trip)."""
        with self.lock:
            self.cancelled = True
            if self.running_on is None:
                return
        threading.Thread(target=self._cancel_statement, name="db-cancel", daemon=True).start()

    def _cancel_statement(self) -> None:
        # Under the lock: the thread cannot move on to another viewer's read while the cancel is on its way.
        with self.lock:
            if self.running_on is not None:
                self.cancel_sent = True
                try:
                    self.running_on.cancel_safe(timeout=CANCEL_TIMEOUT_S)
                except Exception:
                    logger.warning("live: cancelling a database read failed", exc_info=True)


class DatabaseThreads:
    """A few threads that run database work in order, each on its own connection."""

    def __init__(self, threads: int, name: str) -> None:
        self.size = threads
        self.name = name
        self._queue: queue.SimpleQueue[_Read] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._starting = threading.Lock()

    async def read[T](self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in one of the threads, its result here; cancelling the caller cancels the read."""
        self._start()
        read = _Read(asyncio.get_running_loop(), fn, args)
        self._queue.put(read)
        try:
            return await asyncio.shield(read.future)
        except asyncio.CancelledError:
            read.cancel()
            read.future.cancel()  # what it still delivers is dropped, never left unretrieved
            raise

    @property
    def waiting(self) -> int:
        """Reads queued for a thread."""
        return self._queue.qsize()

    def _start(self) -> None:
        if len(self._threads) == self.size:
            return
        with self._starting:
            while len(self._threads) < self.size:
                name = f"{self.name}-{len(self._threads) + 1}"
                thread = threading.Thread(target=self._work, name=name, daemon=True)
                thread.start()
                self._threads.append(thread)

    def _work(self) -> None:
        while True:
            try:
                read = self._queue.get(timeout=IDLE_S)
            except queue.Empty:
                _release_connection()  # idle: hold no connection until work comes again
                read = self._queue.get()
            if read.cancelled:
                continue
            try:
                _connect()
            except Exception as error:
                read.finish(error=error)
                continue
            if read.start():
                self._run(read)
                if read.cancel_sent:
                    _discard_connection()

    @staticmethod
    def _run(read: _Read) -> None:
        try:
            result = read.fn(*read.args)
        except Exception as error:
            read.finish(error=error)
            if isinstance(error, DatabaseError):
                _release_connection()  # cancelled, or broken: the next read starts on a fresh one
        else:
            read.finish(result)


def _connect() -> None:
    """This thread's connection, opened if it has none, with the statement timeout."""
    if connection.connection is None:
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")


def _release_connection() -> None:
    """Close this thread's connection (back to the pool, when there is one, as it was lent)."""
    raw = connection.connection
    if raw is None:
        return
    # On the open connection itself: nothing here may open one (a test's database may be closed to it by now).
    with contextlib.suppress(psycopg.Error):
        raw.execute("RESET statement_timeout")
    _close()


def _discard_connection() -> None:
    """Close this thread's connection for good (never back to a pool): a cancel request may still be on its way
    to its backend, and must not stop the next statement run there."""
    raw = connection.connection
    if raw is not None:
        with contextlib.suppress(Exception):
            raw.close()
    _close()


def _close() -> None:
    with contextlib.suppress(DatabaseError):
        connection.close()


_history = DatabaseThreads(HISTORY_THREADS, "history")
_handshakes = DatabaseThreads(HANDSHAKE_THREADS, "handshake")
_presses = DatabaseThreads(PRESS_THREADS, "press")


async def read_history[T](fn: Callable[..., T], *args: Any) -> T:
    """Run a history read (`fn(*args)`, synchronous, using Django's connection) in the history threads."""
    return await _history.read(fn, *args)


async def read_for_handshake[T](fn: Callable[..., T], *args: Any) -> T:
    """Run a new socket's read (its session and user, its job's row) in the handshake threads."""
    return await _handshakes.read(fn, *args)


async def run_for_socket[T](fn: Callable[..., T], *args: Any) -> T:
    """Run a socket's write (a student's press: its read, then its write) in the press threads."""
    return await _presses.read(fn, *args)
