"""What a job shows at each moment: its figures and its program's state, stored with each batch of events.

The process that runs a job takes a `Snapshot` after every batch its recorder stores,
in the same transaction, and the batch row keeps it (`EventBatch.snapshot`). Only that
process can: a program's state may live in its memory (the replicas' beliefs and
timers, the controllers' history). Every viewer then reads stored snapshots: the live
page and its frames, replay at any moment (the snapshot at or before it), compare,
exports and summaries, so they all show the same numbers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from django.db import connection, transaction

from occviz.jobs.figures import Figure, RunningTotals, Totals
from occviz.jobs.models import EventBatch
from occviz.jobs.recorder import Columns

logger = logging.getLogger(__name__)


@dataclass
class State:
    """A program's contended objects as they are now: `data` is shown as the job's state, `figures` feed its totals."""

    data: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)


class Snapshot(TypedDict):
    seq: int
    """The last event it covers."""
    t_ms: float
    """That event's time on the job's clock."""
    figures: Totals
    state: dict[str, Any]


def empty_snapshot() -> Snapshot:
    """What a job shows before its first stored batch."""
    return {"seq": 0, "t_ms": 0.0, "figures": {}, "state": {}}


class Snapshotter:
    """Takes a running job's snapshot after each batch: its figures counted on, its state read now.

    Called by the recorder inside the transaction that stores the batch. The totals follow
    the stored sequence: the batches other processes stored in between (the shards of a job
    over several processes interleave theirs) are counted on from the store, batch by batch;
    when a batch was not stored after all (PostgreSQL restarting) or a job resumes, the
    totals are recounted from what the store holds before the next batch.
    """

    def __init__(
        self, job_id: int, figures: Sequence[Figure], read_state: Callable[[], State], *, last_seq: int = 0
    ) -> None:
        self.job_id = job_id
        self.figures = tuple(figures)
        self.read_state = read_state
        self._totals = RunningTotals(self.figures)
        # The last event the totals count; None: recount from the store at the first batch (a resumed job).
        self._counted: int | None = None if last_seq else 0

    def take(self, seq_to: int, columns: Columns) -> Snapshot:
        before = seq_to - len(columns["kind"])
        if self._counted is None or self._counted > before or not self._catch_up(before):
            self._totals = RunningTotals.from_store(self.job_id, before, self.figures)
        self._totals.add_columns(columns)
        self._counted = seq_to
        state = self._state()
        figures = self._totals.snapshot(state.figures)
        return {"seq": seq_to, "t_ms": figures["elapsed_ms"], "figures": figures, "state": state.data}

    def _catch_up(self, before: int) -> bool:
        """Count the stored batches after what the totals count, up to `before`; False if they leave a gap.

        Their rows are committed: this batch's transaction waited for theirs on the job row's lock.
        """
        counted = self._counted
        assert counted is not None
        if counted == before:
            return True
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT seq_from, seq_to, kind, duration_us, latency_us, t_us FROM jobs_eventbatch "
                "WHERE job_id = %s AND seq_to > %s AND seq_to <= %s ORDER BY seq_to",
                [self.job_id, counted, before],
            )
            batches = cursor.fetchall()
        for seq_from, seq_to, *_ in batches:
            if seq_from != counted + 1:
                return False
            counted = seq_to
        if counted != before:
            return False
        for _, _, kind, duration_us, latency_us, t_us in batches:
            self._totals.add_columns({"kind": kind, "duration_us": duration_us, "latency_us": latency_us, "t_us": t_us})
        return True

    def _state(self) -> State:
        try:
            # A savepoint: a failed read must not abort the transaction that stores the batch.
            with transaction.atomic():
                return self.read_state()
        except Exception:
            logger.exception("job %s: reading its state failed; this snapshot shows none", self.job_id)
            return State()


def snapshot_at(job_id: int, seq: int) -> Snapshot | None:
    """The job's latest stored snapshot covering no event after `seq`, or None if there is none.

    One step back along the (job, seq_to) index: a replay at any moment reads it cheaply.
    """
    return (
        EventBatch.objects.filter(job_id=job_id, seq_to__lte=seq, snapshot__isnull=False)
        .order_by("-seq_to")
        .values_list("snapshot", flat=True)
        .first()
    )


def snapshot_or_empty(job_id: int, seq: int) -> Snapshot:
    found = snapshot_at(job_id, seq) if seq > 0 else None
    return found or empty_snapshot()
