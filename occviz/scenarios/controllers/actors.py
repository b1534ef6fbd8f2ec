"""The controller race's actors: a controller GETs the Deployment, sets its own field, and writes it all back.

As client-go's Update does, the whole object goes back with every write. With `occ` the
write is a compare-and-swap, and a conflict means re-GET, re-apply the same change and
retry (`with_retries`: client-go's `retry.RetryOnConflict`). With `none` the write is
blind: the fields of the object it read go back with it, erasing whatever another
controller wrote meanwhile.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from occviz.concurrency.retry import RETRY, with_retries
from occviz.concurrency.writer import ActorContext
from occviz.scenarios.controllers.deployment import COLUMNS, FIELDS, OwnedField
from occviz.scenarios.controllers.history import Acknowledge
from occviz.store.cas import swap_for
from occviz.store.models import Deployment

# The whole object written back: checked against the version read, or blind.
_CHECKED = swap_for(Deployment, tuple((column, False) for column in COLUMNS), True)
_BLIND = swap_for(Deployment, tuple((column, False) for column in COLUMNS), False)
_GET = f"SELECT resource_version, {', '.join(COLUMNS)} FROM store_deployment WHERE id = %s"


@dataclass
class Controller:
    """One controller: its writer (session, policy, clocks), its field, and the history it reports to."""

    writer: ActorContext
    owned: OwnedField
    row: int
    controllers: int
    history: Acknowledge
    blind: bool

    def get(self, op: int, attempt: int) -> tuple[int, dict[str, Any]]:
        started = time.perf_counter()
        found = self.writer.cursor.one(_GET, [self.row])
        if found is None:
            raise Deployment.DoesNotExist(f"deployment {self.row} was deleted while the job ran")
        version, *columns = found
        content = dict(zip(COLUMNS, columns, strict=True))
        self.writer.record(
            op,
            attempt,
            "read",
            self.row,
            version_read=version,
            value_read=self.owned.get(content),
            duration_ms=(time.perf_counter() - started) * 1000.0,
        )
        return version, content

    def reconcile(self, op: int) -> bool:
        """Set this controller's field to `op` (its reconcile number); True once a write with it was acknowledged."""
        if self.blind:
            return self._attempt(op, 1, time.perf_counter()) is True
        return with_retries(self.writer, self.row, op, lambda attempt, started: self._attempt(op, attempt, started))

    def _attempt(self, op: int, attempt: int, started: float) -> bool | object:
        version, content = self.get(op, attempt)
        if not self.writer.pause(self.writer.think_ms):
            return False
        self.owned.put(content, op)  # re-applied to what was just read: the change, not the old object
        swap = _BLIND if self.blind else _CHECKED
        t = time.perf_counter()
        result = swap.run(self.row, version, [content[column] for column in COLUMNS], cursor=self.writer.cursor)
        took_ms = (time.perf_counter() - t) * 1000.0
        if result is None:
            self.writer.record(op, attempt, "conflict", self.row, version_read=version, duration_ms=took_ms)
            return RETRY
        written = int(result[0])
        overwrote = written - version - 1  # versions that landed between the GET and this blind write
        self.writer.record(
            op,
            attempt,
            "committed",
            self.row,
            version_read=version,
            version_written=written,
            value_written=op,
            duration_ms=took_ms,
            latency_ms=(time.perf_counter() - started) * 1000.0,
            detail={"field": self.owned.path, **({"overwrote": overwrote} if overwrote else {})},
        )
        values = tuple(owned.get(content) for owned in FIELDS[: self.controllers])
        self.history.acknowledge(self.writer.number, op, version, written, values)
        return True

    def run(self, seconds: float, interval_s: float, stop: threading.Event) -> None:
        """Reconcile every `interval_s` until the job stops; a late reconcile does not make the next one sooner."""
        writer = self.writer
        writer.deadline = time.perf_counter() + seconds
        next_at = time.perf_counter()
        op = 0
        while not stop.is_set() and writer.ms_left() > 0:
            wait_ms = (next_at - time.perf_counter()) * 1000.0
            if wait_ms > 0 and not writer.pause(wait_ms):
                break
            op += 1
            self.reconcile(op)
            next_at = max(next_at + interval_s, time.perf_counter())
