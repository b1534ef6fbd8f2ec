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


def _row_values(columns: Columns) -> list[str]:
    """The EventBatch values of a batch: an array literal per column, then the few details by position."""
    details = {str(position): detail for position, detail in enumerate(columns["detail"]) if detail}
    return [*(_array(columns[name]) for name in _ARRAY_COLUMNS), json.dumps(details)]


# A stored batch, column by column: EVENT_COLUMNS -> one list each, element i is event seq_from + i.
Columns = dict[str, Sequence[Any]]
# (seq_from, seq_to, columns) after each stored batch
FlushListener = Callable[[int, int, Columns], None]


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
        # Called for every step of every actor, between one statement and the next: one
        # clock read and one append. Rounding and encoding wait for the flusher (`_columns`).
        self._queue.append(
            (
                time.perf_counter(),
                actor,
                op,
                attempt,
                kind,
                row,
                version_read,
                version_written,
                value_read,
                value_written,
                duration_ms,
                latency_ms,
                detail,
            )
        )

    def _columns(self, recorded: list[tuple[Any, ...]]) -> Columns:
        """The recorded steps as columns, times in ms since the release and to the microsecond
        (finer digits are noise here, and they cost bytes in every frame and row)."""
        t0 = self._t0
        clock, *middle, durations, latencies, details = zip(*recorded, strict=True)
        columns: Columns = dict(zip(EVENT_COLUMNS[1:-3], middle, strict=True))
        columns["t_ms"] = [round((t - t0) * 1000.0, 3) for t in clock]
        columns["duration_ms"] = [None if ms is None else round(ms, 3) for ms in durations]
        columns["latency_ms"] = [None if ms is None else round(ms, 3) for ms in latencies]
        columns["detail"] = list(details)
        return columns

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
        recorded = [self._queue.popleft() for _ in range(len(self._queue))]
        seq_from = self.last_seq + 1
        seq_to = self.last_seq + len(recorded)
        columns = self._columns(recorded) if recorded else {}
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                if recorded:
                    # The actors' commits wait for fsync; the event store need not add ten more
                    # a second to the same WAL. A crash loses at most the last few batches, and
                    # last_seq goes with them in this same transaction, so the store stays gapless.
                    cursor.execute("SET LOCAL synchronous_commit = off")
                    cursor.execute(_INSERT, [self.job_id, seq_from, seq_to, *_row_values(columns)])
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
            logger.warning(
                "job %s was deleted while running: stopping it, %d events dropped", self.job_id, len(recorded)
            )
            self.on_cancel()
            return
        except Exception:
            self._queue.extendleft(reversed(recorded))
            raise
        if row[0]:
            self.on_cancel()
        if not recorded:
            return
        self.last_seq = seq_to
        for listener in self.listeners:
            listener(seq_from, seq_to, columns)
