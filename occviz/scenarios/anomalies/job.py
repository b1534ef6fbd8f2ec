"""An anomalies job: Hermitage's tests run one by one as step-mode jobs, one event per cell, the table as summary.

Each script of a cell runs as a child job of the `step` scenario in written order
(occviz.jobs.children.run_child: its own events, summary and page), on the app's
PostgreSQL and then, when the job names one, on a MySQL server. Its check
(occviz.steps.hermitage) reads the child's summary; the cell is recorded as an event the
moment its scripts have run, so the table fills in live, and replays, from the events alone.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pymysql

from occviz.jobs.children import run_child
from occviz.jobs.models import Event, Job
from occviz.scenarios.base import State
from occviz.steps import hermitage
from occviz.steps.hermitage import ANOMALIES, LEVELS, PUBLISHED, HermitageTest, level_slug, scripts_of_cell
from occviz.steps.mysql import Server, flavor_of, server_version

if TYPE_CHECKING:
    from occviz.jobs.context import JobContext
    from occviz.jobs.recorder import EventRecorder

POSTGRESQL = "postgresql"
TITLES = {"postgresql": "PostgreSQL", "mariadb": "MariaDB", "mysql": "MySQL"}
PUBLISHED_FOR = {"postgresql": "postgresql", "mariadb": "mysql", "mysql": "mysql"}
"""Which of Hermitage's rows a database's measured row is set beside (MariaDB: MySQL/InnoDB's)."""
PUBLISHED_TITLES = {"postgresql": "Hermitage's PostgreSQL row", "mysql": "Hermitage's MySQL/InnoDB row"}
CELL_KINDS = ("prevented", "occurred", "failed")


def selected(params: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The anomalies and the levels the job runs, in the table's order."""
    anomalies = (params.get("anomalies") or "").split() or list(ANOMALIES)
    levels = [level.replace("-", " ") for level in (params.get("levels") or "").split()] or list(LEVELS)
    return [a for a in ANOMALIES if a in anomalies], [level for level in LEVELS if level in levels]


def judge_child(test: HermitageTest, child: Job) -> dict[str, Any]:
    """A script's verdict from its step job; a job that did not run to its end judges nothing."""
    summary = child.summary or {}
    if child.status != Job.Status.SUCCEEDED or not summary.get("steps") or summary.get("steps_not_run"):
        return {
            "script": test.name,
            "variant": test.variant or "basic",
            "read_only": test.read_only,
            "prevented": None,
            "how": f"its run did not finish ({child.status}: {summary.get('invariant') or child.error or ''})",
            "job": child.pk,
        }
    verdict = test.judge(summary["steps"], summary.get("final") or {})
    verdict["job"] = child.pk
    return verdict


class Journal:
    """The job's events as recorded, kept in this process too: the state of a batch is made before it is stored."""

    def __init__(self, recorder: EventRecorder) -> None:
        self.recorder = recorder
        self.base_seq = recorder.last_seq
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def record(self, lane: int, op: int, kind: str, detail: dict[str, Any]) -> None:
        with self._lock:
            self.events.append({"kind": kind, "detail": detail})
            self.recorder.record(lane, op, 1, kind, detail=detail)

    def up_to(self, last_seq: int) -> list[dict[str, Any]]:
        with self._lock:
            return self.events[: max(0, last_seq - self.base_seq)]


_journals: dict[int, Journal] = {}
_journals_lock = threading.Lock()


def run(context: JobContext) -> dict[str, Any]:
    journal = Journal(context.recorder)
    with _journals_lock:
        _journals[context.job.pk] = journal
    try:
        return _run(context, journal)
    finally:
        with _journals_lock:
            _journals.pop(context.job.pk, None)


def _run(context: JobContext, journal: Journal) -> dict[str, Any]:
    params = context.params
    anomalies, levels = selected(params)
    recorder = context.recorder
    recorder.start_clock()
    targets: list[tuple[str, str, str]] = [(POSTGRESQL, "", "the app's PostgreSQL")]
    unreachable: dict[str, str] = {}
    url = params.get("database") or ""
    if url:
        server = Server.from_url(url)
        try:
            version = server_version(server)
        except pymysql.MySQLError as error:
            unreachable["mysql"] = f"{server.label} did not answer: {error}"
            journal.record(2, 0, "unreachable", {"server": server.label, "message": str(error)})
        else:
            flavor = flavor_of(version)
            targets.append((flavor, url, f"{flavor} {version} at {server.label}"))
            journal.record(2, 0, "server", {"database": flavor, "server": f"{version} at {server.label}"})
    scripts = sum(len(scripts_of_cell(anomaly, level)) for anomaly in anomalies for level in levels)
    cells = len(anomalies) * len(levels) * len(targets)
    journal.record(1, 0, "plan", {"scripts": scripts * len(targets), "cells": cells})
    tables: dict[str, dict[str, dict[str, Any]]] = {}
    op = 0
    for lane, (database, target, _) in enumerate(targets, start=1):
        for level in levels:
            for anomaly in anomalies:
                if context.stop.is_set():
                    break
                judged = []
                for test in scripts_of_cell(anomaly, level):
                    child = run_child(
                        context,
                        "step",
                        {
                            "script": test.name,
                            "pace": "written order",
                            "isolation": level,
                            "lock_timeout": params["lock_timeout"],
                            "step_ms": params["step_ms"],
                            "database": target,
                        },
                    )
                    judged.append(judge_child(test, child))
                    if context.stop.is_set():
                        break
                cell = make_cell(database, anomaly, level, judged)
                tables.setdefault(database, {}).setdefault(level, {})[anomaly] = cell
                op += 1
                journal.record(lane, op, cell_kind(cell), {"database": database, **cell})
            recorder.flush()
    recorder.flush()
    context.elapsed_s = recorder.now_ms() / 1000.0
    return summarize(tables, targets, unreachable, anomalies, levels, context.stop_reason)


def make_cell(database: str, anomaly: str, level: str, judged: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    published = PUBLISHED[PUBLISHED_FOR[database]][level][anomaly]
    if any(found["prevented"] is None for found in judged) or not judged:
        failed = [found for found in judged if found["prevented"] is None]
        how = "; ".join(f"{found['script']}: {found['how']}" for found in failed) or "not run"
        return {
            "anomaly": anomaly,
            "level": level,
            "prevented": None,
            "mark": "?",
            "how": how,
            "jobs": [found["job"] for found in judged],
            "variants": list(judged),
            "hermitage": published,
            "differs": True,
        }
    cell = hermitage.cell(anomaly, level, judged)
    return {"anomaly": anomaly, "level": level, **cell, "hermitage": published, "differs": cell["mark"] != published}


def cell_kind(cell: Mapping[str, Any]) -> str:
    if cell["prevented"] is None:
        return "failed"
    return "prevented" if cell["prevented"] else "occurred"


def summarize(
    tables: Mapping[str, Mapping[str, Mapping[str, Any]]],
    targets: Sequence[tuple[str, str, str]],
    unreachable: Mapping[str, str],
    anomalies: Sequence[str],
    levels: Sequence[str],
    stopped: str,
) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for database, _, _ in targets:
        measured_rows = tables.get(database, {})
        summary[database] = {level: dict(measured_rows[level]) for level in levels if level in measured_rows}
    for database, message in unreachable.items():
        summary[database] = {"error": message}
    expected = len(anomalies) * len(levels)
    differences = {
        database: [
            f"{cell['anomaly']} at {cell['level']}: measured {cell['mark']}, "
            f"{PUBLISHED_TITLES[PUBLISHED_FOR[database]]} {cell['hermitage']}"
            for level in levels
            for cell in tables.get(database, {}).get(level, {}).values()
            if cell["differs"]
        ]
        for database, _, _ in targets
    }
    measured = sum(len(row) for row in tables.get(POSTGRESQL, {}).values())
    problems = list(differences[POSTGRESQL])
    if measured < expected:
        problems.append(f"only {measured} of {expected} PostgreSQL cells were measured ({stopped or 'not run'})")
    ok = not problems
    if ok:
        verdict = f"PostgreSQL's {measured} cells equal Hermitage's published row"
    else:
        verdict = "PostgreSQL differs from Hermitage's published row: " + "; ".join(problems)
    for database, _, described in targets[1:]:
        found = differences[database]
        against = "Hermitage's MySQL/InnoDB row"
        compared = f"differs from {against}: " + "; ".join(found) if found else f"as {against}"
        verdict += f". {described}: {compared}"
    for message in unreachable.values():
        verdict += f". {message}"
    jobs = [job for table in tables.values() for row in table.values() for cell in row.values() for job in cell["jobs"]]
    summary.update(
        {
            "servers": {database: described for database, _, described in targets},
            "anomalies": list(anomalies),
            "levels": list(levels),
            "differences": differences,
            "cells": sum(len(row) for table in tables.values() for row in table.values()),
            "runs": len(jobs),
            "invariant_ok": ok,
            "invariant": verdict,
        }
    )
    return summary


# -- what the pages show ---------------------------------------------------------------------


def _detail(raw: Any) -> dict[str, Any]:
    return dict(json.loads(raw) if isinstance(raw, str) else raw or {})


def table_state(params: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The table as the events so far fill it: each database's rows beside Hermitage's published row."""
    anomalies, levels = selected(params)
    cells: dict[tuple[str, str, str], dict[str, Any]] = {}
    databases = [POSTGRESQL]
    servers = {POSTGRESQL: "the app's PostgreSQL"}
    unreachable = ""
    for event in events:
        detail = _detail(event.get("detail"))
        if event["kind"] == "server":
            databases.append(detail["database"])
            servers[detail["database"]] = detail["server"]
        elif event["kind"] == "unreachable":
            unreachable = f"{detail.get('server')} did not answer: {detail.get('message')}"
        elif event["kind"] in CELL_KINDS:
            cells[detail["database"], detail["level"], detail["anomaly"]] = detail
    tables: list[dict[str, Any]] = []
    for database in databases:
        published = PUBLISHED_FOR[database]
        rows: list[dict[str, Any]] = []
        measured: list[dict[str, Any]] = []
        for level in levels:
            row = []
            for anomaly in anomalies:
                found = cells.get((database, level, anomaly))
                if found is not None:
                    measured.append(found)
                row.append(found or {"anomaly": anomaly, "level": level, "mark": "…", "pending": True})
            marks = [PUBLISHED[published][level][anomaly] for anomaly in anomalies]
            rows.append({"level": level, "slug": level_slug(level), "cells": row, "published": marks})
        tables.append(
            {
                "database": database,
                "title": TITLES.get(database, database),
                "server": servers.get(database, ""),
                "published_title": PUBLISHED_TITLES[published],
                "rows": rows,
                "measured": len(measured),
                "differences": [cell for cell in measured if cell.get("differs")],
            }
        )
    total = len(anomalies) * len(levels) * (2 if len(databases) > 1 or params.get("database") else 1)
    done = len(cells)
    return {
        "anomalies": anomalies,
        "tables": tables,
        "progress": f"{done} of {total} cells measured",
        "unreachable": unreachable,
        "differences": len(tables[0]["differences"]),
        "done": done,
    }


def read_state(job_id: int, params: Mapping[str, Any]) -> State:
    """The table from the job's events: those stored up to now, as the batch being stored ends them."""
    with _journals_lock:
        journal = _journals.get(job_id)
    events: Iterable[Mapping[str, Any]]
    if journal is not None:
        # Inside the transaction that stores the batch: last_seq already counts it, and no event after it.
        last_seq = Job.objects.filter(pk=job_id).values_list("last_seq", flat=True).first() or 0
        events = journal.up_to(last_seq)
    else:
        stored = Event.objects.filter(job_id=job_id, kind__in=(*CELL_KINDS, "server", "unreachable")).order_by("seq")
        events = stored.values("kind", "detail")
    state = table_state(params, events)
    return State(state, {"cells_measured": state["done"], "postgresql_differences": state["differences"]})
