"""Frames: what a viewer of a job receives, built only from what PostgreSQL has stored.

A frame covers the events `seq_from..seq_to` of one job, with the job's running
totals as of `seq_to` (its scenario's figures) and its scenario's live state (the
contended objects) as it was when the frame was built.
The publisher (in the worker) and every reader (in the web processes) count the
totals with the same `RunningTotals`, so a frame read back from the store after a
reconnect carries the same figures as the live one did.

All functions here are synchronous and use Django's connection: callers in async
code wrap them in `database_sync_to_async`.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter as Tally
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from django.db import connection

from occviz.jobs.events import EVENT_FIELDS, read_events
from occviz.jobs.recorder import Columns
from occviz.scenarios import SCENARIOS
from occviz.scenarios.base import Figure, Scenario, State

# A frame never carries more events than this; a longer range becomes several frames.
MAX_EVENTS_PER_FRAME = 2000

# A job's figures so far: "events", "elapsed_ms" and one entry per figure its scenario declares.
Totals = dict[str, Any]


class Percentiles(TypedDict):
    p50: float | None
    p95: float | None
    p99: float | None


class Frame(TypedDict):
    type: str
    job: int
    seq_from: int
    seq_to: int
    events: list[dict[str, Any]]
    totals: Totals
    state: dict[str, Any]
    """The scenario's live state (the counter's `rows`, ...): sent as keys of the frame itself."""


_BARE = Scenario()


@dataclass(frozen=True)
class JobInfo:
    """What the frame builders need to know about a job (read once, not per frame)."""

    id: int
    scenario: str
    strategy: str
    params: dict[str, Any]

    @property
    def spec(self) -> Scenario:
        """The job's scenario; a bare one (no figures, no state) if it is not installed here."""
        return SCENARIOS.get(self.scenario, _BARE)

    def read_state(self) -> State:
        return self.spec.read_state(self.id, self.params)


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


def event_array(event: dict[str, Any]) -> list[Any]:
    """One event as the stream sends it: its values in EVENT_FIELDS order (the names are in the hello)."""
    return [event[name] for name in EVENT_FIELDS]


def make_frame(job_id: int, events: list[dict[str, Any]], totals: Totals, state: dict[str, Any]) -> Frame:
    return {
        "type": "frame",
        "job": job_id,
        "seq_from": events[0]["seq"],
        "seq_to": events[-1]["seq"],
        "events": events,
        "totals": totals,
        "state": state,
    }


class WireFrame:
    """A frame with its JSON encoded once, in two parts, so consecutive frames merge by joining text.

    `events_json` is the frame's events as arrays (EVENT_FIELDS order), comma-separated,
    without the enclosing brackets; `tail_json` is `,"totals":{...},<state>}` (the counter's
    state is `"rows":[...]`). A merged frame takes the events of all its parts and the tail (totals and state as of
    its `seq_to`) of the last one, which is exactly what one frame over the whole range says.
    Both are encoded on first use (the fragment socket never needs them); a feed
    encodes its frames as it reads them, in the database thread.
    """

    __slots__ = ("_events_json", "_tail_json", "frame", "html")

    def __init__(self, frame: Frame) -> None:
        self.frame = frame
        self._events_json: str | None = None
        self._tail_json: str | None = None
        self.html: str | None = None
        """The page's fragments as of this frame, when someone in this process watches with `html=1`."""

    @classmethod
    def encoded(cls, frame: Frame) -> WireFrame:
        wire = cls(frame)
        _ = (wire.events_json, wire.tail_json)  # encoded now, in the caller's thread
        return wire

    @property
    def events_json(self) -> str:
        if self._events_json is None:
            text = json.dumps([event_array(event) for event in self.frame["events"]], separators=(",", ":"))
            self._events_json = text[1:-1]
        return self._events_json

    @property
    def tail_json(self) -> str:
        if self._tail_json is None:
            tail = {"totals": self.frame["totals"], **self.frame["state"]}
            text = json.dumps(tail, separators=(",", ":"))
            self._tail_json = "," + text[1:-1]  # without the closing brace: wire_text may add the fragments
        return self._tail_json

    @property
    def seq_from(self) -> int:
        return self.frame["seq_from"]

    @property
    def seq_to(self) -> int:
        return self.frame["seq_to"]

    @property
    def count(self) -> int:
        return len(self.frame["events"])

    def after(self, position: int) -> WireFrame:
        """This frame without its events up to `position` (a client that resumed in its middle)."""
        if position < self.seq_from:
            return self
        events = [event for event in self.frame["events"] if event["seq"] > position]
        part = WireFrame({**self.frame, "seq_from": events[0]["seq"], "events": events})
        part.html = self.html
        return part


def wire_text(job_id: int, parts: Sequence[WireFrame], *, html: bool = False) -> str:
    """One `frame` message covering consecutive `parts` (seq_from of the first to seq_to of the last).

    With `html`, the page's fragments as of the last part go with it (when it has them).
    """
    fragments = parts[-1].html if html else None
    return (
        f'{{"type":"frame","job":{job_id},"seq_from":{parts[0].seq_from},"seq_to":{parts[-1].seq_to},'
        f'"events":[{",".join(part.events_json for part in parts)}]{parts[-1].tail_json}'
        + ("}" if fragments is None else f',"html":{json.dumps(fragments)}}}')
    )


def merge_runs(parts: Sequence[WireFrame], limit: int = MAX_EVENTS_PER_FRAME) -> list[list[WireFrame]]:
    """Consecutive parts grouped so that each group holds at most `limit` events (a part is never split)."""
    runs: list[list[WireFrame]] = []
    count = 0
    for part in parts:
        if runs and count + part.count <= limit:
            runs[-1].append(part)
            count += part.count
        else:
            runs.append([part])
            count = part.count
    return runs


class StoreReader:
    """Reads one job's frames from the store, from a position on, keeping the running totals.

    Used by a job feed (once per process, for everyone watching) and by a viewer that
    must catch up on history the feed does not hold.
    """

    # Catching up reads many frames in a burst: the live state is read at most this often.
    STATE_MAX_AGE_S = 0.1

    def __init__(self, job: JobInfo, after: int) -> None:
        self.job = job
        self.position = after
        self._totals: RunningTotals | None = None
        self._state = State()
        self._state_read_at = -math.inf

    def next_frame(self, upto: int, state: State | None = None, *, limit: int = MAX_EVENTS_PER_FRAME) -> Frame | None:
        """The next frame after `position` reaching at most `upto`, or None if there is nothing new."""
        if upto <= self.position:
            return None
        if self._totals is None:
            self._totals = RunningTotals.from_store(self.job.id, self.position, self.job.spec.figures)
        events = read_events(self.job.id, self.position, min(limit, upto - self.position))
        if not events:
            return None
        self._totals.add(events)
        if state is None:
            state = self.state()
        self.position = events[-1]["seq"]
        return make_frame(self.job.id, events, self._totals.snapshot(state.figures), state.data)

    def state(self) -> State:
        if time.monotonic() - self._state_read_at > self.STATE_MAX_AGE_S:
            self._state = self.job.read_state()
            self._state_read_at = time.monotonic()
        return self._state

    def seek(self, position: int) -> None:
        """Move to another position (a client's resume): the totals are recounted from the store."""
        if position != self.position:
            self.position = position
            self._totals = None
