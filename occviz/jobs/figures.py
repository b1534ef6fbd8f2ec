"""What a job shows as numbers: the figures a program declares, and their counting event by event.

A program (a scenario) declares its `Figure`s; `RunningTotals` counts them over the
job's events as they are stored, in the process that runs the job, and each stored
batch keeps the result (`occviz.jobs.snapshots`). Every viewer reads those stored
figures: nothing else counts them again.
"""

from __future__ import annotations

import math
from collections import Counter as Tally
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypedDict

from django.db import connection

from occviz.jobs.recorder import Columns

# A job's figures so far: "events", "elapsed_ms" and one entry per figure its program declares.
Totals = dict[str, Any]


@dataclass(frozen=True)
class Figure:
    """One figure of a job, counted from its events (or reported by its live state).

    Exactly one source: `count` (events of these kinds), `per_second` (those kinds per
    second of the job's clock), `total_ms` (the sum of `duration_ms` over these kinds),
    `percentiles` (p50/p95/p99 of `latency_ms` over these kinds) or `from_state`.
    """

    key: str
    label: str
    count: tuple[str, ...] = ()
    per_second: tuple[str, ...] = ()
    total_ms: tuple[str, ...] = ()
    percentiles: tuple[str, ...] = ()
    from_state: bool = False
    alarm: bool = False
    """Shown in red when above zero (lost updates, stale writes that landed)."""
    shown: bool = True
    """In the page's figures panel (some exist only for the stream's totals)."""

    def as_json(self) -> dict[str, Any]:
        return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()}


class Percentiles(TypedDict):
    p50: float | None
    p95: float | None
    p99: float | None


class LatencyHistogram:
    """Latencies in log-spaced buckets 1% wide: bounded memory and work, percentiles within 0.5%.

    The same bucket formula runs in SQL (`bucket_sql`), so a reader that starts in the
    middle of a job loads the histogram of everything before it in one small query.
    """

    MIN_MS = 0.001
    GROWTH = 1.01
    _LOG_GROWTH = math.log(GROWTH)

    def __init__(self) -> None:
        self.buckets: Tally[int] = Tally()
        self.count = 0

    @classmethod
    def bucket(cls, ms: float) -> int:
        return math.floor(math.log(max(ms, cls.MIN_MS) / cls.MIN_MS) / cls._LOG_GROWTH)

    @classmethod
    def bucket_sql(cls, column: str) -> str:
        return f"floor(ln(greatest({column}, {cls.MIN_MS}) / {cls.MIN_MS}) / ln({cls.GROWTH}))::int"

    def add(self, ms: float) -> None:
        self.buckets[self.bucket(ms)] += 1
        self.count += 1

    def add_bucket(self, bucket: int, count: int) -> None:
        self.buckets[bucket] += count
        self.count += count

    def percentiles(self) -> Percentiles:
        if not self.count:
            return {"p50": None, "p95": None, "p99": None}
        wanted = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
        found: dict[str, float] = {}
        seen = 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            for name, q in wanted.items():
                if name not in found and seen >= q * self.count:
                    # the middle of the bucket, geometrically
                    found[name] = round(self.MIN_MS * self.GROWTH ** (bucket + 0.5), 3)
            if len(found) == len(wanted):
                break
        return {"p50": found["p50"], "p95": found["p95"], "p99": found["p99"]}


class RunningTotals:
    """A job's figures so far, counted event by event from its scenario's `Figure`s: O(events) per batch."""

    def __init__(self, figures: Sequence[Figure]) -> None:
        self.figures = tuple(figures)
        self.by_kind: Tally[str] = Tally()
        self.elapsed_ms = 0.0
        self.total_ms = {figure.key: 0.0 for figure in self.figures if figure.total_ms}
        self.latency = {figure.key: LatencyHistogram() for figure in self.figures if figure.percentiles}
        self._total_kinds = {figure.key: frozenset(figure.total_ms) for figure in self.figures if figure.total_ms}
        self._latency_kinds = {
            figure.key: frozenset(figure.percentiles) for figure in self.figures if figure.percentiles
        }

    @classmethod
    def from_store(cls, job_id: int, upto: int, figures: Sequence[Figure]) -> RunningTotals:
        """The totals of the job's stored events up to `upto`, in one aggregate query and one per percentile."""
        totals = cls(figures)
        if upto <= 0:
            return totals
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT kind, count(*), coalesce(sum(duration_ms), 0), max(t_ms) FROM jobs_event "
                "WHERE job_id = %s AND seq <= %s GROUP BY kind",
                [job_id, upto],
            )
            for kind, count, duration_ms, last_ms in cursor.fetchall():
                totals.by_kind[kind] = count
                for key, kinds in totals._total_kinds.items():
                    if kind in kinds:
                        totals.total_ms[key] += float(duration_ms)
                totals.elapsed_ms = max(totals.elapsed_ms, float(last_ms or 0.0))
            for key, kinds in totals._latency_kinds.items():
                cursor.execute(
                    f"SELECT {LatencyHistogram.bucket_sql('latency_ms')}, count(*) FROM jobs_event "
                    "WHERE job_id = %s AND seq <= %s AND kind = ANY(%s) AND latency_ms IS NOT NULL GROUP BY 1",
                    [job_id, upto, sorted(kinds)],
                )
                for bucket, count in cursor.fetchall():
                    totals.latency[key].add_bucket(bucket, count)
        return totals

    def add(self, events: Iterable[dict[str, Any]]) -> None:
        self.add_steps((e["kind"], e["duration_ms"], e["latency_ms"], e["t_ms"]) for e in events)

    def add_columns(self, columns: Columns) -> None:
        """Count a stored recorder batch, column by column: the flusher's hot path."""
        kinds = columns["kind"]
        self.by_kind.update(kinds)
        for key, wanted in self._total_kinds.items():
            if not wanted.isdisjoint(kinds):
                self.total_ms[key] += (
                    sum(us for kind, us in zip(kinds, columns["duration_us"], strict=True) if kind in wanted and us)
                    / 1000.0
                )
        for key, wanted in self._latency_kinds.items():
            histogram = self.latency[key]
            for kind, us in zip(kinds, columns["latency_us"], strict=True):
                if kind in wanted and us is not None:
                    histogram.add(us / 1000.0)
        self.elapsed_ms = max(self.elapsed_ms, max(columns["t_us"]) / 1000.0)

    def add_steps(self, steps: Iterable[tuple[str, float | None, float | None, float]]) -> None:
        for kind, duration_ms, latency_ms, t_ms in steps:
            self.by_kind[kind] += 1
            if duration_ms is not None:
                for key, wanted in self._total_kinds.items():
                    if kind in wanted:
                        self.total_ms[key] += duration_ms
            if latency_ms is not None:
                for key, wanted in self._latency_kinds.items():
                    if kind in wanted:
                        self.latency[key].add(latency_ms)
            if t_ms > self.elapsed_ms:
                self.elapsed_ms = t_ms

    def snapshot(self, state_figures: dict[str, Any]) -> Totals:
        count = self.by_kind
        totals: Totals = {"events": sum(count.values()), "elapsed_ms": round(self.elapsed_ms, 3)}
        for figure in self.figures:
            if figure.count:
                totals[figure.key] = sum(count[kind] for kind in figure.count)
            elif figure.per_second:
                # over the job's own clock (the last event's time), so a replayed frame says what the live one said
                n = sum(count[kind] for kind in figure.per_second)
                totals[figure.key] = round(n * 1000.0 / self.elapsed_ms, 1) if self.elapsed_ms > 0 else 0.0
            elif figure.total_ms:
                totals[figure.key] = round(self.total_ms[figure.key], 3)
            elif figure.percentiles:
                totals[figure.key] = self.latency[figure.key].percentiles()
            elif figure.from_state:
                totals[figure.key] = state_figures.get(figure.key)
        return totals
