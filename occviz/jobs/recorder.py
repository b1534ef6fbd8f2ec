"""The event recorder: actors append, one flusher per job writes batches to PostgreSQL.

Actors must not wait on the event store, so `record()` only appends to an
in-process deque (append and popleft are atomic, no lock needed). A flusher thread
drains it every `interval` seconds, numbers the events with the job's sequence,
stores them as one EventBatch row (an array per column) and moves `Job.last_seq` in
the same transaction, so a reader that sees `last_seq = n` finds every event up to n.
The same statement reads the job's cancel flag, which is how a cancel reaches the
actors (`on_cancel`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection, transaction

logger = logging.getLogger(__name__)

EVENT_COLUMNS = (
    "t_ms",
    "actor",
    "op",
    "attempt",
    "kind",
    "row",
    "version_read",
    "version_written",
    "value_read",
    "value_written",
    "duration_ms",
    "latency_ms",
    "detail",
)
_ARRAY_COLUMNS = EVENT_COLUMNS[:-1]  # detail is stored apart: most events have none
_INSERT = (
    f"INSERT INTO jobs_eventbatch (job_id, seq_from, seq_to, {', '.join(f'"{c}"' for c in _ARRAY_COLUMNS)}, detail) "
    f"VALUES (%s, %s, %s, {', '.join(['%s'] * len(_ARRAY_COLUMNS))}, %s)"
)


def _array(values: Sequence[Any]) -> str:
    """A PostgreSQL array literal of numbers, None or bare words, in one join (no per-value Python call).

    Only a None turns into the text "None" here: the columns hold numbers and event kinds.
    """
    return "{" + ",".join(map(str, values)).replace("None", "NULL") + "}"


def _details(details: Sequence[str]) -> str:
    """The batch's non-empty details as one JSON object, by position: {"17": {...}}."""
    return "{" + ",".join(f'"{i}":{text}' for i, text in enumerate(details) if text != "{}") + "}"


# (seq_from, seq_to, events as recorded) after each stored batch
FlushListener = Callable[[int, int, Sequence[tuple[Any, ...]]], None]


class JobDeleted(Exception):
    """The job's row is gone: nothing more can be stored for it."""


class EventRecorder:
    def __init__(self, job_id: int, *, interval: float = 0.1, last_seq: int = 0) -> None:
        self.job_id = job_id
        self.interval = interval
        self.last_seq = last_seq
        self.on_cancel: Callable[[], None] = lambda: None
        self.listeners: list[FlushListener] = []
        self._queue: deque[tuple[Any, ...]] = deque()
        self._t0 = time.perf_counter()
        self._stop = threading.Event()
        self._flush_lock = threading.Lock()  # the flusher thread, and a caller that needs everything stored now
        self._thread = threading.Thread(target=self._run, name=f"job-{job_id}-flusher", daemon=True)

    def start_clock(self) -> None:
        """Event times are measured from here: the moment the actors are released."""
        self._t0 = time.perf_counter()

    def now_ms(self) -> float:
        return (time.perf_counter() - self._t0) * 1000.0

    def record(
        self,
        actor: int,
        op: int,
        attempt: int,
        kind: str,
        row: int | None = None,
        *,
        version_read: int | None = None,
        version_written: int | None = None,
        value_read: int | None = None,
        value_written: int | None = None,
        duration_ms: float | None = None,
        latency_ms: float | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        # Called for every step of every actor: keep it to one append.
        # Times to the microsecond: finer digits are noise here, and they cost bytes in every frame.
        self._queue.append(
            (
                round((time.perf_counter() - self._t0) * 1000.0, 3),
                actor,
                op,
                attempt,
                kind,
                row,
                version_read,
                version_written,
                value_read,
                value_written,
                None if duration_ms is None else round(duration_ms, 3),
                None if latency_ms is None else round(latency_ms, 3),
                json.dumps(detail) if detail else "{}",
            )
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the flusher after it has stored everything recorded so far."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        else:
            self.flush()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    self.flush()
                except Exception:
                    # PostgreSQL restarting, say: the batch went back on the queue; try again next tick.
                    logger.exception("job %s: storing events failed, retrying", self.job_id)
                    connection.close()
            self.flush()
        finally:
            connection.close()

    def flush(self) -> None:
        """Store what has been recorded so far (safe to call from any thread)."""
        with self._flush_lock:
            self._flush()

    def _flush(self) -> None:
        batch = [self._queue.popleft() for _ in range(len(self._queue))]
        seq_from = self.last_seq + 1
        seq_to = self.last_seq + len(batch)
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                if batch:
                    # The actors' commits wait for fsync; the event store need not add ten more
                    # a second to the same WAL. A crash loses at most the last few batches, and
                    # last_seq goes with them in this same transaction, so the store stays gapless.
                    cursor.execute("SET LOCAL synchronous_commit = off")
                    *columns, details = zip(*batch, strict=True)
                    cursor.execute(_INSERT, [self.job_id, seq_from, seq_to, *map(_array, columns), _details(details)])
                    cursor.execute(
                        "UPDATE jobs_job SET last_seq = %s WHERE id = %s RETURNING cancel_requested",
                        [seq_to, self.job_id],
                    )
                else:
                    cursor.execute("SELECT cancel_requested FROM jobs_job WHERE id = %s", [self.job_id])
                row = cursor.fetchone()
                if row is None:
                    # The job was deleted while it ran: its events have nothing to belong to,
                    # so this batch goes too (rolled back before its foreign key is checked).
                    raise JobDeleted(self.job_id)
        except JobDeleted:
            logger.warning("job %s was deleted while running: stopping it, %d events dropped", self.job_id, len(batch))
            self.on_cancel()
            return
        except Exception:
            self._queue.extendleft(reversed(batch))
            raise
        if row[0]:
            self.on_cancel()
        if not batch:
            return
        self.last_seq = seq_to
        for listener in self.listeners:
            listener(seq_from, seq_to, batch)
