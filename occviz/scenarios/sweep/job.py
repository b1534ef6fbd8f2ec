"""A sweep job: its points measured one after the other, each recorded as an event; its curve as they stand.

Level by level (so the curve grows left to right), each strategy runs a counter race of its
own for `seconds` (`run_child`: a job with its own page, linked to the sweep), then pgbench
runs the occ writer's transaction with as many clients on a counter row of the sweep's own.
A point's conflicts are every attempt that did not commit (a conflict, a serialization
failure, a deadlock, a lock timeout; for pgbench, a compare-and-swap that matched no row),
and its conflict rate their share of all attempts.

A stop (cancel) stops the part running now, and the sweep makes no more.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from occviz.concurrency.latency import Network
from occviz.jobs.children import run_child
from occviz.jobs.models import Event, Job
from occviz.jobs.snapshots import snapshot_or_empty
from occviz.pgbench import PgbenchUnavailable, run_pgbench
from occviz.scenarios.base import State
from occviz.scenarios.sweep.plan import (
    PGBENCH,
    axis_of,
    level_key,
    levels_of,
    over_latency,
    series_of,
    series_style,
)
from occviz.store.models import Counter

if TYPE_CHECKING:
    from occviz.jobs.context import JobContext

KINDS = ("point_started", "point", "point_missing", "point_stopped")

# The points recorded by the sweeps this process runs, as (kind, detail): the snapshot stored with a batch is
# taken before the batch is, so the curve it shows is read from here (from the store in any other process).
_recorded: dict[int, list[tuple[str, dict[str, Any]]]] = {}
_recorded_lock = threading.Lock()


class Stopped(Exception):
    """The sweep was stopped while this point ran: it is not measured."""


class Missing(Exception):
    """This point could not be measured; the message says why."""


def _writers(count: int) -> str:
    return f"{count} writer{'s' * (count != 1)}"


def _at(point: Mapping[str, Any]) -> str:
    """Where a point is: "4 writers", or "4 writers 20 ms away" on the latency axis."""
    if point.get("latency_ms") is None:
        return _writers(int(point["writers"]))
    return f"{_writers(int(point['writers']))} {float(point['latency_ms']):g} ms away"


def _rate(amount: float, seconds: float) -> float:
    return round(amount / seconds, 1) if seconds > 0 else 0.0


def _share(part: int, whole: int) -> float:
    return round(part / whole, 3) if whole else 0.0


def measure_counter(
    context: JobContext, strategy: str, writers: int, latency_ms: float | None = None
) -> dict[str, Any]:
    """A counter race of `writers` writers with `strategy` (each `latency_ms` away), a part of the sweep; its point."""
    params = context.params
    race = {
        "strategy": strategy,
        "writers": writers,
        "seconds": params["seconds"],
        "think_ms": params["think_ms"],
        "retry": params["retry"],
    }
    if latency_ms is not None:
        race["latency_ms"] = f"{latency_ms:g}"
    child = run_child(context, "counter", race)
    summary = child.summary or {}
    if child.status == Job.Status.CANCELLED or summary.get("stopped_by") not in (None, "time limit"):
        raise Stopped(f"job {child.pk} {child.status}")
    if child.status != Job.Status.SUCCEEDED or not summary:
        raise Missing(f"job {child.pk} {child.status}: {(child.error or 'no summary').splitlines()[0]}")
    # Its rates over its own clock, as its page shows them (its last snapshot's).
    elapsed_s = float(snapshot_or_empty(child.pk, child.last_seq)["figures"].get("elapsed_ms") or 0.0) / 1000.0
    attempts, committed = int(summary["attempts"]), int(summary["committed"])
    return {
        "strategy": strategy,
        "writers": writers,
        **({} if latency_ms is None else {"latency_ms": latency_ms}),
        "commits_per_s": summary["commits_per_s"],
        "conflicts_per_s": _rate(attempts - committed, elapsed_s),
        "conflict_rate": _share(attempts - committed, attempts),
        "committed": committed,
        "attempts": attempts,
        "job": child.pk,
        "invariant_ok": summary["invariant_ok"],
    }


def measure_pgbench(context: JobContext, row: int, clients: int, latency_ms: float | None = None) -> dict[str, Any]:
    """pgbench with `clients` clients on the sweep's row (through a proxy `latency_ms` away); its point."""
    params = context.params
    try:
        with Network(f"{latency_ms or 0:g}") as network:
            run = run_pgbench(
                row,
                clients,
                params["seconds"],
                think_ms=params["think_ms"] or 0.0,
                stop=context.stop,
                host=network.connection(1).get("host"),
            )
    except PgbenchUnavailable as error:
        raise Missing(str(error)) from None
    if run.stopped:
        raise Stopped("pgbench stopped")
    return {
        "strategy": PGBENCH,
        "writers": clients,
        **({} if latency_ms is None else {"latency_ms": latency_ms}),
        "commits_per_s": _rate(run.committed, run.seconds),
        "conflicts_per_s": _rate(run.conflicts, run.seconds),
        "conflict_rate": _share(run.conflicts, run.transactions),
        "committed": run.committed,
        "attempts": run.transactions,
    }


def run(context: JobContext) -> dict[str, Any]:
    job, params = context.job, context.params
    series = series_of(params)
    plan = [(level, name) for level in levels_of(params) for name in series]
    row = None
    if PGBENCH in series:
        row = Counter.objects.create(namespace=f"job-{job.pk}", name=PGBENCH, job=job).pk
    points: list[dict[str, Any]] = []
    missing: list[dict[str, Any]] = []
    stopped: dict[str, Any] | None = None

    def note(lane: int, op: int, kind: str, detail: dict[str, Any]) -> None:
        # Known to the curve first: the snapshot stored with a batch then shows every point the batch holds.
        with _recorded_lock:
            _recorded[job.pk].append((kind, detail))
        context.recorder.record(lane, op, 1, kind, detail=detail)

    with _recorded_lock:
        _recorded[job.pk] = []
    try:
        for op, (level, name) in enumerate(plan, start=1):
            if context.stop.is_set():
                break
            lane = series.index(name) + 1
            # On the latency axis the writers stay at max_writers and the level is each one's latency.
            latency_ms = float(level) if over_latency(params) else None
            writers = int(params["max_writers"]) if over_latency(params) else int(level)
            where: dict[str, Any] = {"strategy": name, "writers": writers, "seconds": params["seconds"]}
            if latency_ms is not None:
                where["latency_ms"] = latency_ms
            note(lane, op, "point_started", where)
            try:
                if name == PGBENCH:
                    assert row is not None
                    point = measure_pgbench(context, row, writers, latency_ms)
                else:
                    point = measure_counter(context, name, writers, latency_ms)
            except Stopped:
                stopped = {**where, "reason": context.stop_reason or "stopped"}
                note(lane, op, "point_stopped", stopped)
                break
            except Missing as error:
                missing.append({**where, "reason": str(error)})
                note(lane, op, "point_missing", missing[-1])
                continue
            points.append(point)
            note(lane, op, "point", {**point, "seconds": params["seconds"]})
        figures = context.final_figures()
    finally:
        with _recorded_lock:
            _recorded.pop(job.pk, None)
    ok, verdict = _verdict(points, missing, stopped, len(plan))
    return {
        "series": series,
        **({"axis": "latency", "writers": params["max_writers"]} if over_latency(params) else {}),
        "levels": levels_of(params),
        "points": points,
        "missing": missing,
        "stopped_at": stopped,
        "points_measured": len(points),
        "points_missing": len(missing),
        "points_planned": len(plan),
        "peak_commits_per_s": figures.get("peak_commits_per_s"),
        "peak_at": figures.get("peak_at"),
        "invariant_ok": ok,
        "invariant": verdict,
        "duration_s": round(context.recorder.now_ms() / 1000.0, 3),
    }


def _verdict(
    points: list[dict[str, Any]], missing: list[dict[str, Any]], stopped: dict[str, Any] | None, planned: int
) -> tuple[bool, str]:
    """Every point measured (or, stopped, every one before the stop), and every counter part's invariant held."""
    broken = [point for point in points if point.get("invariant_ok") is False]
    said = []
    if stopped is not None:
        said.append(
            f"stopped ({stopped['reason']}) at {stopped['strategy']} with {_at(stopped)}: "
            f"{len(points)} of {planned} points measured"
        )
    else:
        said.append(f"{len(points)} of {planned} points measured")
    for point in missing:
        said.append(f"{point['strategy']} at {_at(point)} missing: {point['reason']}")
    if broken:
        said.append(
            "invariant broken in "
            + ", ".join(f"job {point['job']} ({point['strategy']}, {_at(point)})" for point in broken)
        )
    elif any("job" in point for point in points):
        said.append("every counter race's invariant holds")
    return not missing and not broken, "; ".join(said)


def curve(params: Mapping[str, Any], events: Iterable[tuple[str, Mapping[str, Any]]]) -> State:
    """The sweep as its events tell it: each point's cell by level and series, the one measuring now, the peak."""
    series = series_of(params)
    key = level_key(params)
    latency = over_latency(params)

    def level_of(detail: Mapping[str, Any]) -> float:
        return float(detail[key]) if latency else int(detail[key])

    cells: dict[tuple[str, float], dict[str, Any]] = {}
    points: list[dict[str, Any]] = []
    running: dict[str, Any] | None = None
    states = {"point_started": "running", "point": "measured", "point_missing": "missing", "point_stopped": "stopped"}
    for kind, detail in events:
        cell = {**detail, "state": states[kind]}
        cells[str(detail["strategy"]), level_of(detail)] = cell
        running = cell if kind == "point_started" else None
        if kind == "point":
            points.append(dict(detail))
    rows = []
    for level in levels_of(params):
        at = {"writers": int(params["max_writers"]), "latency_ms": level} if latency else {"writers": level}
        planned = [cells.get((name, level), {"strategy": name, **at, "state": "planned"}) for name in series]
        rows.append({**at, "level": level, "cells": planned})
    peak = max(points, key=lambda point: float(point["commits_per_s"]), default=None)
    return State(
        {
            "series": [series_style(name) for name in series],
            "levels": levels_of(params),
            "axis": axis_of(params),
            "points": points,
            "rows": rows,
            "running": running,
            "peak": peak,
        },
        {
            "peak_commits_per_s": None if peak is None else round(float(peak["commits_per_s"])),
            "peak_at": None if peak is None else f"{peak['strategy']}, {_at(peak)}",
        },
    )


def read_state(job_id: int, params: Mapping[str, Any]) -> State:
    """The curve as the sweep's points stand (a few events each): what every frame, replay and export carry."""
    with _recorded_lock:
        recorded = list(_recorded[job_id]) if job_id in _recorded else None
    if recorded is None:
        stored = Event.objects.filter(job_id=job_id, kind__in=KINDS).order_by("seq").values_list("kind", "detail")
        recorded = list(stored)
    return curve(params, recorded)
