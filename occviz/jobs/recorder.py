"""The event recorder: actors append, one flusher per job writes batches to PostgreSQL.

Actors must not wait on the event store, so `record()` only appends to an
in-process deque (append and popleft are atomic, no lock needed). A flusher thread
drains it every `interval` seconds, numbers the events with the job's sequence,
stores them as one EventBatch row (an array per column) and moves `Job.last_seq` in
the same transaction, so a reader that sees `last_seq = n` finds every event up to n.
The same statement reads the job's cancel flag, which is how a cancel reaches the
actors (`on_cancel`), and its count of requested controls (`on_controls` when it moves).
With a `snapshot` callback, each batch row also keeps what the job shows as of its last
event (`occviz.jobs.snapshots`), made in the same transaction.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.db import connection, transaction

from occviz.jobs import arrays
from occviz.store.session import check

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
# A stored batch, column by column: BATCH_COLUMNS and detail -> one sequence each, element i is event seq_from + i.
Columns = dict[str, Sequence[Any]]
# (seq_from, seq_to, columns) after each stored batch
FlushListener = Callable[[int, int, Columns], None]
# (seq_to, columns) -> what the job shows as of seq_to, stored with the batch
SnapshotMaker = Callable[[int, Columns], Mapping[str, Any]]


# What an EventBatch stores of each event: an array per column, times as whole microseconds;
# the view `jobs_event` gives them back in EVENT_COLUMNS, in milliseconds. `detail` is
# stored apart: most events have none. Each column: (element type, may it hold NULL).
BATCH_COLUMNS: dict[str, tuple[int, bool]] = {
    "t_us": (arrays.INT8, False),
    "actor": (arrays.INT4, False),
    "op": (arrays.INT4, False),
    "attempt": (arrays.INT4, False),
    "kind": (arrays.TEXT, False),
    "row": (arrays.INT8, True),
    "version_read": (arrays.INT8, True),
    "version_written": (arrays.INT8, True),
    "value_read": (arrays.INT8, True),
    "value_written": (arrays.INT8, True),
    "duration_us": (arrays.INT8, True),
    "latency_us": (arrays.INT8, True),
}
_INSERT = (
    "INSERT INTO jobs_eventbatch (job_id, seq_from, seq_to, "
    + ", ".join(f'"{name}"' for name in BATCH_COLUMNS)
    + ", detail, snapshot) VALUES ($1, $2, $3, "
    + ", ".join(
        f"array_replace(${n}, {arrays.NONE}, NULL)" if nullable else f"${n}"
        for n, (_, nullable) in enumerate(BATCH_COLUMNS.values(), start=4)
    )
    + f", ${len(BATCH_COLUMNS) + 4}, ${len(BATCH_COLUMNS) + 5})"
).encode()
_INT8, _JSONB = 20, 3802
_PARAM_TYPES = [_INT8, _INT8, _INT8, *(arrays.ARRAY_OIDS[oid] for oid, _ in BATCH_COLUMNS.values()), _JSONB, _JSONB]
# scalars as text, arrays in binary
_PARAM_FORMATS = [0, 0, 0, *[1] * len(BATCH_COLUMNS), 0, 0]
_KIND_BYTES: dict[str, bytes] = {}


def _array(values: Sequence[Any], element_oid: int, nullable: bool) -> bytes:
    if element_oid == arrays.TEXT:
        return arrays.text_array(values, _KIND_BYTES)
    return arrays.int_array(arrays.with_none(values) if nullable else values, element_oid)


def _insert_batch(
    job_id: int, seq_from: int, seq_to: int, columns: Columns, snapshot: Mapping[str, Any] | None = None
) -> None:
    """One EventBatch row, straight over libpq with binary arrays (Django's cursor would send text)."""
    details = {str(position): detail for position, detail in enumerate(columns["detail"]) if detail}
    values = [
        str(job_id).encode(),
        str(seq_from).encode(),
        str(seq_to).encode(),
        *(_array(columns[name], oid, nullable) for name, (oid, nullable) in BATCH_COLUMNS.items()),
        json.dumps(details).encode(),
        None if snapshot is None else json.dumps(snapshot, separators=(",", ":")).encode(),
    ]
    pgconn = connection.connection.pgconn
    check(pgconn.exec_params(_INSERT, values, _PARAM_TYPES, _PARAM_FORMATS))


# How often the flusher stores a batch: an event waits up to this long before any viewer can see it.
# 60 job pages' p95 event-to-client latency: 128-131 ms at 0.1 s, 100-104 ms at 0.075 s; what
# their frames cost the job grows as the interval shrinks (docs/performance.md).
FLUSH_INTERVAL_S = 0.075


class JobDeleted(Exception):
    """The job's row is gone: nothing more can be stored for it."""


class EventRecorder:
    def __init__(
        self,
        job_id: int,
        *,
        interval: float = FLUSH_INTERVAL_S,
        last_seq: int = 0,
        snapshot: SnapshotMaker | None = None,
    ) -> None:
        self.job_id = job_id
        self.interval = interval
        self.last_seq = last_seq
        self.snapshot = snapshot
        self.on_cancel: Callable[[], None] = lambda: None
        self.on_controls: Callable[[], None] = lambda: None
        self.controls_seen = 0
        self.listeners: list[FlushListener] = []
        self.interleaved = False
        """Other recorders store batches of the same job (its other shards): the numbers jump between ours."""
        self._queue: deque[tuple[Any, ...]] = deque()
        self._t0 = time.perf_counter()
        self._released_at: float | None = None
        """The clock's start on the wall clock (seconds since the epoch), until a batch has stored it."""
        self._stop = threading.Event()
        self._flush_lock = threading.Lock()  # the flusher thread, and a caller that needs everything stored now
        self._thread = threading.Thread(target=self._run, name=f"job-{job_id}-flusher", daemon=True)

    def start_clock(self, at: float | None = None) -> None:
        """Event times are measured from here (or `at`, on perf_counter's clock): when the actors are released.

        The next batch stores the moment on the wall clock as the job's `released_at` (the first shard's, in a
        job over several processes; they agree within the barrier's precision).
        """
        self._t0 = time.perf_counter() if at is None else at
        self._released_at = time.time() - (time.perf_counter() - self._t0)

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
        """The recorded steps as BATCH_COLUMNS and detail: times in whole microseconds since the
        release (finer digits are noise here, and they cost bytes in every row and frame)."""
        t0 = self._t0
        clock, *middle, durations, latencies, details = zip(*recorded, strict=True)
        columns: Columns = dict(zip(tuple(BATCH_COLUMNS)[1:-2], middle, strict=True))
        columns["t_us"] = [round((t - t0) * 1e6) for t in clock]
        columns["duration_us"] = [None if ms is None else round(ms * 1e3) for ms in durations]
        columns["latency_us"] = [None if ms is None else round(ms * 1e3) for ms in latencies]
        columns["detail"] = details
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
        columns = self._columns(recorded) if recorded else {}
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                if recorded:
                    # The actors' commits wait for fsync; the event store need not add ten more
                    # a second to the same WAL. A crash loses at most the last few batches, and
                    # last_seq goes with them in this same transaction, so the store stays gapless.
                    # (This first statement through Django's cursor also opens the transaction
                    # that the libpq-level insert below runs in.)
                    cursor.execute("SET LOCAL synchronous_commit = off")
                    # Numbered from the job row, not from memory: after a crash that lost the
                    # last batches (and their last_seq), the next batch follows what is stored.
                    released_at = self._released_at
                    cursor.execute(
                        "UPDATE jobs_job SET last_seq = last_seq + %s, "
                        "released_at = coalesce(released_at, to_timestamp(%s)) WHERE id = %s "
                        "RETURNING cancel_requested, controls_requested, last_seq",
                        [len(recorded), released_at, self.job_id],
                    )
                else:
                    cursor.execute(
                        "SELECT cancel_requested, controls_requested, last_seq FROM jobs_job WHERE id = %s",
                        [self.job_id],
                    )
                row = cursor.fetchone()
                if row is None:
                    # The job was deleted while it ran: its events have nothing to belong to,
                    # so this batch goes too (rolled back before its foreign key is checked).
                    raise JobDeleted(self.job_id)
                seq_to = row[2]
                seq_from = seq_to - len(recorded) + 1
                if recorded:
                    snapshot = None if self.snapshot is None else self.snapshot(seq_to, columns)
                    _insert_batch(self.job_id, seq_from, seq_to, columns, snapshot)
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
        if row[1] > self.controls_seen:
            self.controls_seen = row[1]
            self.on_controls()
        if not recorded:
            return
        if self._released_at == released_at:
            self._released_at = None
        if seq_from != self.last_seq + 1 and not self.interleaved:
            logger.warning(
                "job %s: events %d..%d were lost with the database's last commits; the store goes on from %d",
                self.job_id,
                seq_from,
                self.last_seq,
                seq_from,
            )
        self.last_seq = seq_to
        for listener in self.listeners:
            listener(seq_from, seq_to, columns)
