"""A step-mode job: its script on fresh rows (a schema of its own), its actors' sessions, its steps as events.

By hand, each `step` control runs one actor's next step; the job ends when every actor has
run its script, after IDLE_LIMIT_S without a step, or on cancel (not at OCCVIZ_MAX_SECONDS:
a class may take its time). In written order the script runs by itself. Whatever happens,
every connection is closed and the schema dropped before the summary is made, and the
summary says whether the database agrees.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection, connections

from occviz.jobs.models import Event, Job
from occviz.scenarios.base import State
from occviz.scenarios.step.database import described, mysql_dialect, mysql_released
from occviz.scenarios.step.scripts import BY_HAND, script_of
from occviz.scenarios.step.state import StepFold, fold
from occviz.steps.engine import BLOCKED, ERROR, Outcome, Session, final_values, views_as_json
from occviz.steps.mysql import MySQLDialect
from occviz.steps.postgres import SCHEMA_PREFIX, PostgresDialect, drop_schema, session_schemas
from occviz.steps.script import Script, StepKind

if TYPE_CHECKING:
    from occviz.jobs.context import JobContext
    from occviz.jobs.recorder import EventRecorder

logger = logging.getLogger(__name__)

IDLE_LIMIT_S = 30 * 60.0
"""A job stepped by hand ends after this long without a step."""
_RELEASE_PATIENCE_S = 3.0

_ERROR_KINDS = {"40001": "serialization_failure"}
_DONE_KINDS = {
    StepKind.BEGIN: "begin",
    StepKind.READ: "read",
    StepKind.PREDICATE_READ: "read",
    StepKind.LOCKING_READ: "read",
    StepKind.BLIND_WRITE: "write",
    StepKind.CAS_WRITE: "write",
    StepKind.INSERT: "insert",
    StepKind.DELETE: "delete",
    StepKind.COMMIT: "commit",
    StepKind.ABORT: "abort",
}


def conninfo() -> dict[str, Any]:
    """psycopg.connect's arguments for the app's database: the actors' sessions go where the app's do."""
    params = connections["default"].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return params


def _error_code(outcome: Mapping[str, Any]) -> str:
    """The error's SQLSTATE, or MySQL's number where its SQLSTATE is the catch-all HY000 ("1205")."""
    sqlstate, message = outcome.get("sqlstate") or "", outcome.get("message") or ""
    number = message.split(":", 1)[0]
    return number if sqlstate in ("", "HY000") and number.isdigit() else sqlstate


def event_kind(outcome: Outcome) -> str:
    if outcome.status == BLOCKED:
        return "blocked"
    if outcome.status == ERROR:
        if outcome.deadlock:
            return "deadlock"
        return "lock_timeout" if outcome.lock_timeout else _ERROR_KINDS.get(outcome.sqlstate or "", "step_error")
    if outcome.resumed:
        return "resumed"
    if outcome.conflict:
        return "conflict"
    if outcome.rolled_back:
        return "abort"
    return _DONE_KINDS[outcome.step.kind]


def rows_text(rows: list[dict[str, int]] | None) -> str:
    if not rows:
        return "no row"
    return ", ".join(f"{row['id']}={row['value']} (v{row['version']})" for row in rows)


class Journal:
    """The job's events in the order they were recorded, kept beside the recorder's queue for the state to fold."""

    def __init__(self, recorder: EventRecorder, script: Script) -> None:
        self.recorder = recorder
        self.script = script
        self.base_seq = recorder.last_seq
        self.events: list[dict[str, Any]] = []
        self.last_step_at = time.monotonic()
        self._lock = threading.Lock()

    def record(self, actor: int, op: int, kind: str, row: int | None = None, **fields: Any) -> None:
        with self._lock:
            self.events.append({"actor": actor, "op": op, "kind": kind, "row": row, **fields})
            self.recorder.record(actor, op, 1, kind, row, **fields)

    def ready(self, session: Session) -> None:
        views = views_as_json(session.views())
        for number, (name, pid) in enumerate(session.backends().items(), start=1):
            steps = len(self.script.steps_of[name])
            detail = {"pid": pid, "steps": steps, "committed": session.committed, "actors": views}
            self.record(number, 0, "ready", detail=detail)

    def outcome(self, outcome: Outcome) -> None:
        """An outcome of the engine as an event: the step, its result, the rows after it."""
        self.last_step_at = time.monotonic()
        kind = event_kind(outcome)
        step = outcome.step
        rows = outcome.rows
        detail: dict[str, Any] = {
            "step": step.text,
            "line": step.line,
            "step_kind": step.kind.value,
            "committed": outcome.committed,
            "seen": outcome.seen,
            "actors": views_as_json(outcome.actors),
            "status": outcome.actors[outcome.actor].status,
        }
        optional = {
            "rows": rows,
            "count": outcome.count,
            "values": rows_text(rows) if rows is not None else None,
            "sqlstate": outcome.sqlstate,
            "message": outcome.message,
            "began": outcome.began,
            "waits_for": list(outcome.waits_for) if outcome.status == BLOCKED else None,
            "waiting_on": " and ".join(outcome.waits_for) or None,
            "rolled_back": outcome.rolled_back or None,
        }
        if outcome.rolled_back:
            optional["message"] = "it had failed earlier, so COMMIT rolled it back"
        detail.update({key: value for key, value in optional.items() if value is not None})
        fields: dict[str, Any] = {"detail": detail}
        if outcome.status != BLOCKED:
            fields["duration_ms"] = outcome.duration_ms
        single = rows[0] if rows is not None and len(rows) == 1 else None
        if single is not None and step.kind.reads:
            fields.update(value_read=single["value"], version_read=single["version"])
        elif single is not None and step.kind.writes and step.kind != StepKind.DELETE:
            fields.update(value_written=single["value"], version_written=single["version"])
        actor_number = step.number
        self.record(actor_number, outcome.position + 1, kind, single["id"] if single else None, **fields)


# The step jobs running in this process, by job: their events as recorded, for the state.
_journals: dict[int, Journal] = {}
_journals_lock = threading.Lock()


def drop_stale_schemas() -> None:
    """Drop the schemas of step jobs that are no longer running (their process died before it could).

    Only a job's schema (`occviz_step_<job id>`): a session of another name is its maker's to drop.
    """
    info = conninfo()
    for schema in session_schemas(info):
        suffix = schema.removeprefix(SCHEMA_PREFIX)
        if not suffix.isdigit():
            continue
        if not Job.objects.filter(pk=int(suffix), status=Job.Status.RUNNING).exists():
            logger.info("dropping %s, left behind by a step job that is no longer running", schema)
            drop_schema(info, schema)


def run(context: JobContext) -> dict[str, Any]:
    job, params = context.job, context.params
    script, question = script_of(params)
    dialect: PostgresDialect | MySQLDialect
    if params.get("database"):
        dialect = mysql_dialect(params["database"], str(job.pk))
    else:
        drop_stale_schemas()
        dialect = PostgresDialect(conninfo(), str(job.pk))
    journal = Journal(context.recorder, script)
    session = Session(
        script,
        dialect,
        isolation=params["isolation"],
        lock_timeout_s=float(params["lock_timeout"]),
        on_outcome=journal.outcome,
    )
    with _journals_lock:
        _journals[job.pk] = journal
    context.recorder.start_clock()
    stopped = ""
    try:
        with session:
            journal.ready(session)
            if params["pace"] == BY_HAND:
                stopped = _by_hand(context, session, journal)
            else:
                timer = threading.Timer(settings.OCCVIZ_MAX_SECONDS, context.request_stop, ["time limit"])
                timer.daemon = True
                timer.start()
                try:
                    session.run_in_order(step_ms=float(params["step_ms"]), stop=context.stop)
                finally:
                    timer.cancel()
        context.elapsed_s = context.recorder.now_ms() / 1000.0
        context.recorder.flush()
        folded = fold(script, list(journal.events), question)
    finally:
        with _journals_lock:
            _journals.pop(job.pk, None)
    if isinstance(dialect, MySQLDialect):
        released, dropped = mysql_released(dialect), not dialect.exists()
    else:
        released, dropped = _released(dialect.schema), not _schema_exists(dialect.schema)
    summary = summarize(params, folded, session.committed, released, dropped, stopped or context.stop_reason)
    summary["duration_s"] = round(context.elapsed_s, 4)
    summary["database"] = described(dialect) if isinstance(dialect, MySQLDialect) else "postgresql"
    return summary


def _by_hand(context: JobContext, session: Session, journal: Journal) -> str:
    """Take the `step` controls until every actor has run its script, the job idles too long, or it is stopped."""

    def control(action: str, actor: int | None, seconds: float | None) -> None:
        journal.last_step_at = time.monotonic()
        if action == "next":
            session.advance_in_order()
        elif action == "step" and actor is not None:
            session.advance(f"T{actor}")
        else:
            raise ValueError(f"a step job takes the step control for one actor, or next; not {action!r}")

    context.on_control(control)
    while not context.stop.is_set():
        if session.finished:
            return ""
        if time.monotonic() - journal.last_step_at > IDLE_LIMIT_S:
            context.request_stop("idle")
            return "idle"
        context.stop.wait(0.1)
    return context.stop_reason


def _released(schema: str) -> bool:
    """Whether the database shows no session of the job's any more (a closed backend may linger a moment)."""
    deadline = time.monotonic() + _RELEASE_PATIENCE_S
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE starts_with(application_name, %s)", [f"{schema} "]
            )
            (left,) = cursor.fetchone()
        if left == 0 or time.monotonic() > deadline:
            return bool(left == 0)
        time.sleep(0.05)


def _schema_exists(schema: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [schema])
        return cursor.fetchone() is not None


def _findings(folded: StepFold) -> list[str]:
    """What the script showed, in a few words each."""
    found = []
    lost = folded.lost_updates
    if lost:
        found.append(f"{lost} update{'s' * (lost != 1)} lost")
    if folded.kinds["conflict"]:
        found.append(f"{folded.kinds['conflict']} conflict{'s' * (folded.kinds['conflict'] != 1)} (no row matched)")
    for position in folded.order:
        outcome = folded.outcomes[position]
        actor = folded.script.steps[position].actor
        if outcome.get("kind") == "deadlock":
            database = "PostgreSQL" if outcome.get("sqlstate") == "40P01" else "the database"
            found.append(f"deadlock: {database} aborted {actor} ({outcome.get('sqlstate')})")
        elif outcome.get("kind") == "serialization_failure":
            found.append(f"{actor} got 40001 ({outcome.get('message')})")
        elif outcome.get("kind") == "lock_timeout":
            found.append(f"{actor} timed out waiting for a lock ({_error_code(outcome)})")
    found += sorted(set(folded.waits))
    for actor in folded.script.actors:
        if folded.actors.get(actor, {}).get("isolation"):
            found.append(f"{actor} left its transaction open: rolled back as the job ended")
        elif ends := folded.ended.get(actor):
            found.append(f"{actor} {ends[-1]}")
    return found


def summarize(
    params: Mapping[str, Any],
    folded: StepFold,
    committed: list[dict[str, int]],
    released: bool,
    dropped: bool,
    stopped: str,
) -> dict[str, Any]:
    steps = folded.steps()
    unfinished = [step for step in steps if step["outcome"] == "blocked" and step.get("then") is None]
    not_run = len(folded.script.steps) - len(steps)
    final = final_values(committed)
    problems = []
    if not released:
        problems.append("a session of the job was still open after it ended")
    if not dropped:
        problems.append("its rows' schema was still there after it ended")
    if unfinished:
        problems.append(f"{len(unfinished)} blocked step{'s' * (len(unfinished) != 1)} never reported an outcome")
    findings = _findings(folded)
    ran = f"{len(steps)} of {len(folded.script.steps)} steps ran"
    if not_run:
        ran += f" ({not_run} not run: {stopped or 'the job ended'})"
    final_text = " ".join(f"{key}={value}" for key, value in final.items()) or "no rows"
    if problems:
        verdict = f"{ran}; but {'; '.join(problems)}"
    else:
        verdict = (
            f"{ran}, each with its outcome as reported; final {final_text}"
            + (f": {'; '.join(findings)}" if findings else "")
            + f". Its {len(folded.script.actors) + 1} sessions were closed and its rows dropped."
        )
    kinds = folded.kinds
    return {
        "script": params.get("script") or None,
        "question": folded.question,
        "isolation": params.get("isolation"),
        "pace": params.get("pace"),
        "actors": list(folded.script.actors),
        "steps": steps,
        "final": final,
        "final_text": final_text,
        "initial": final_values([{"id": i, "value": v, "version": 1} for i, v in folded.script.rows]),
        "steps_taken": len(steps),
        "steps_not_run": not_run,
        "lost_updates": folded.lost_updates,
        "conflicts": kinds["conflict"],
        "lock_waits": kinds["blocked"],
        "commits": kinds["commit"],
        "aborts": kinds["abort"],
        "serialization_failures": kinds["serialization_failure"],
        "deadlocks": kinds["deadlock"],
        "lock_timeouts": kinds["lock_timeout"],
        "errors": kinds["step_error"],
        "findings": findings,
        "connections_released": released,
        "rows_dropped": dropped,
        "invariant_ok": not problems,
        "invariant": verdict,
    }


def read_state(job_id: int, params: Mapping[str, Any]) -> State:
    """The job's state folded from its events: those stored up to now, as the batch being stored ends them."""
    try:
        script, question = script_of(params)
    except Exception:
        return State()
    with _journals_lock:
        journal = _journals.get(job_id)
    if journal is not None:
        # Inside the transaction that stores the batch: last_seq already counts it, and no event after it.
        last_seq = Job.objects.filter(pk=job_id).values_list("last_seq", flat=True).first() or 0
        events: Sequence[Mapping[str, Any]] = journal.events[: max(0, last_seq - journal.base_seq)]
    else:
        events = list(Event.objects.filter(job_id=job_id).order_by("seq").values("actor", "op", "kind", "detail"))
    folded = fold(script, events, question)
    return State(folded.state(), {"lost_updates": folded.lost_updates, "steps_taken": len(folded.order)})
