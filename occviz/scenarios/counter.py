"""The counter race: N writers x M increments (or S seconds) over K counter rows.

Every writer increments a randomly chosen row of the job's own K rows with the
chosen strategy until its increments are done or the job's time is up (S seconds, else
OCCVIZ_MAX_SECONDS): a deadline that think time, retry waits and lock waits count
against. At the end the job checks its invariant against the rows:
protected strategies must show final = initial + committed; `none` must have
counted its lost updates exactly (every committed blind write moved the version
once, so versions written minus value gained is the number of updates erased).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django import forms
from django.conf import settings
from django.db import connection, transaction

from occviz.concurrency.retry import LARGEST_FACTOR, LONGEST_WAIT_MS, PRESETS, make_policy
from occviz.concurrency.strategies import PROTECTED, STRATEGIES, Writer, connected
from occviz.scenarios.base import (
    ERROR,
    DecimalNumberField,
    EventKind,
    Figure,
    Preset,
    Scenario,
    ScenarioForm,
    State,
    WholeNumberField,
    check_limit,
)
from occviz.scenarios.outside import outside_conflict_kind, outside_deleted_kind, outside_write
from occviz.store.models import Counter, conflict_message

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from occviz.jobs.context import Actor, JobContext
    from occviz.jobs.models import Job

DEFAULT_INCREMENTS = 100


class CounterForm(ScenarioForm):
    strategy = forms.ChoiceField(choices=[(s, s) for s in STRATEGIES])
    writers = WholeNumberField(min_value=1, initial=4)
    increments = WholeNumberField(min_value=1, required=False, help_text="Per writer; leave empty with seconds.")
    seconds = DecimalNumberField(
        min_value=0.1, required=False, help_text="Run for a duration instead: waits included, the job ends by then."
    )
    rows = WholeNumberField(min_value=1, required=False, initial=1)
    think_ms = DecimalNumberField(min_value=0, required=False, initial=0, label="Think time (ms)")
    retry = forms.ChoiceField(choices=[(p, p) for p in PRESETS], required=False, initial="k8s-default-backoff")
    max_attempts = WholeNumberField(min_value=1, required=False)
    base_ms = DecimalNumberField(
        min_value=0, max_value=LONGEST_WAIT_MS, required=False, initial=10.0, label="Exponential base (ms)"
    )
    factor = DecimalNumberField(
        min_value=1.0, max_value=LARGEST_FACTOR, required=False, initial=2.0, label="Exponential factor"
    )
    cap_ms = DecimalNumberField(
        min_value=0,
        max_value=LONGEST_WAIT_MS,
        required=False,
        initial=1000.0,
        label="Exponential cap (ms)",
        help_text=f"The longest wait; 0: up to {LONGEST_WAIT_MS} ms.",
    )
    lock = forms.ChoiceField(
        choices=[("update", "FOR UPDATE"), ("share", "FOR SHARE")], required=False, initial="update"
    )
    isolation = forms.ChoiceField(
        choices=[("serializable", "SERIALIZABLE"), ("repeatable-read", "REPEATABLE READ")],
        required=False,
        initial="serializable",
    )
    initial_value = WholeNumberField(required=False, initial=0, min_value=-(2**62), max_value=2**62)
    seed = WholeNumberField(
        required=False, min_value=0, max_value=2**32 - 1, help_text="Seed for row choice and jitter."
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("increments") is not None and data.get("seconds") is not None:
            self.add_error("seconds", "Give increments or seconds, not both.")
        elif data.get("increments") is None and data.get("seconds") is None:
            data["increments"] = DEFAULT_INCREMENTS
        check_limit(self, "writers", data.get("writers"), "OCCVIZ_MAX_WRITERS", "writers")
        check_limit(self, "increments", data.get("increments"), "OCCVIZ_MAX_INCREMENTS", "increments per writer")
        check_limit(self, "seconds", data.get("seconds"), "OCCVIZ_MAX_SECONDS", "seconds")
        check_limit(self, "rows", data.get("rows"), "OCCVIZ_MAX_ROWS", "rows")
        check_limit(self, "think_ms", data.get("think_ms"), "OCCVIZ_MAX_THINK_MS", "ms of think time")
        check_limit(self, "max_attempts", data.get("max_attempts"), "OCCVIZ_MAX_ATTEMPTS", "attempts")
        if data.get("increments") and data.get("think_ms") and not self.errors:
            floor_s = data["increments"] * data["think_ms"] / 1000.0
            if floor_s > settings.OCCVIZ_MAX_SECONDS:
                self.add_error(
                    "think_ms",
                    f"{data['increments']} increments with {data['think_ms']:g} ms of think time take at least "
                    f"{floor_s:.0f} s, more than the {settings.OCCVIZ_MAX_SECONDS} s a job may run.",
                )
        return data


def _make_rows(job: Job, params: dict[str, Any]) -> list[int]:
    namespace = f"job-{job.pk}"
    counters = Counter.objects.bulk_create(
        Counter(namespace=namespace, name=f"row-{i}", value=params["initial_value"], job=job)
        for i in range(1, params["rows"] + 1)
    )
    return [counter.pk for counter in counters]


def run(context: JobContext) -> dict[str, Any]:
    job, params = context.job, context.params
    rows = _make_rows(job, params)
    policy = make_policy(
        params["retry"],
        params["max_attempts"],
        base_ms=params["base_ms"],
        factor=params["factor"],
        cap_ms=params["cap_ms"],
    )
    increment = STRATEGIES[params["strategy"]]
    seed = params["seed"] if params["seed"] is not None else random.randrange(2**32)
    seconds = params["seconds"]
    limit_s = float(seconds or settings.OCCVIZ_MAX_SECONDS)

    def writer_actor(number: int) -> Actor:
        def act(ready: Callable[[], object]) -> None:
            writer = Writer(
                number=number,
                recorder=context.recorder,
                policy=policy,
                think_ms=params["think_ms"],
                stop=context.stop,
                rng=random.Random(seed * 1_000 + number),
                lock_mode=params["lock"],
                isolation=params["isolation"],
            )
            with connected(writer):
                ready()
                writer.deadline = time.perf_counter() + limit_s
                op = 0
                while not context.stop.is_set():
                    if seconds is None and op >= params["increments"]:
                        break
                    if writer.ms_left() <= 0:
                        # Whoever sees the time up first says so (the job's timer may be a moment later).
                        context.request_stop("time limit")
                        break
                    op += 1
                    row = rows[0] if len(rows) == 1 else writer.rng.choice(rows)
                    increment(writer, row, op)

        return act

    lanes, own_rows = iter(range(params["writers"] + 1, 2**31)), set(rows)
    context.on_outside_write(
        lambda payload: record_outside_write(context, own_rows, payload), next_actor=lanes.__next__
    )
    context.run_actors([writer_actor(n) for n in range(1, params["writers"] + 1)], time_limit_s=limit_s)
    with transaction.atomic():
        # The rows locked while they are read: every outside write that landed before is
        # then recorded, and none lands after, so the rows and the events tell one story.
        list(Counter.objects.filter(pk__in=rows).select_for_update().values_list("pk"))
        tally = tally_rows(job.pk, params["initial_value"])
        context.settle_outside_writes()
    context.recorder.flush()
    return summarize(job, params, rows, context.elapsed_s, seed, tally)


def record_outside_write(context: JobContext, rows: set[int], payload: Mapping[str, Any]) -> None:
    """An admin's or API writer's write to one of the job's rows, as an event on that writer's lane.

    value_read/value_written: the value before and after; for a blind write that lowered the
    value, detail.erased is how much of the job's count it took away. detail.delta (after -
    before) is what the summary adds to the job's own increments.
    """
    if payload.get("resource") != "counters" or payload.get("object_id") not in rows:
        return
    write = outside_write(context, payload)
    before, after = write.before.get("value"), write.after.get("value", 0)
    detail = dict(write.detail, name=payload.get("name"))
    fields: dict[str, Any] = {"version_read": write.version_read, "value_read": before}
    if write.type == "MODIFIED":
        delta = int(after) - int(before or 0)
        detail["delta"] = delta
        if write.blind and delta < 0:
            detail["erased"] = -delta
        kind = "outside_write"
        fields.update(version_written=write.version_written, value_written=after)
    elif write.type == "CONFLICT":
        kind = "outside_conflict"
        fields.update(value_written=after)
    elif write.type == "DELETED":
        kind = "outside_deleted"
        # What the row had counted leaves with it: the summary still counts it.
        detail.update(removed_versions=int(payload["resource_version"]) - 1, removed_value=before)
    else:
        return  # a new object is not one of the job's rows
    context.recorder.record(write.actor, 0, 1, kind, int(payload["object_id"]), detail=detail, **fields)


def _percentiles(values: list[float | None]) -> dict[str, float | None]:
    p50, p95, p99 = values if values else (None, None, None)
    return {"p50": _round(p50), "p95": _round(p95), "p99": _round(p99)}


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


@dataclass(frozen=True)
class RowTally:
    """The job's counter rows as stored now, and what their versions and values say."""

    rows: list[tuple[int, str, int, int]]  # (id, name, value, resource_version)
    versions_written: int  # every committed write, blind or not, moved its row's version by exactly one
    value_gained: int

    @property
    def lost_updates(self) -> int:
        """Writes that landed but whose increment did not survive: erased by a blind write."""
        return self.versions_written - self.value_gained


def tally_rows(job_id: int, initial_value: int) -> RowTally:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, name, value, resource_version FROM store_counter WHERE job_id = %s ORDER BY id", [job_id]
        )
        rows = cursor.fetchall()
    return RowTally(
        rows=rows,
        versions_written=sum(version - 1 for _, _, _, version in rows),
        value_gained=sum(value - initial_value for _, _, value, _ in rows),
    )


@dataclass
class OutsideTally:
    """What the outside writers' events (the admin's, the API's) did to the job's rows."""

    commits: int = 0
    delta: int = 0
    """The sum of their writes' after - before: what the rows gained (or lost) by them."""
    erased: int = 0
    """What blind writes took away from the count: the job's increments they wrote over."""
    erased_by: dict[str, int] = field(default_factory=dict)
    removed_versions: int = 0
    removed_value: int = 0
    """Versions written to, and value of, rows deleted from outside (counted as if still there)."""
    removed_rows: int = 0


def tally_outside(job_id: int) -> OutsideTally:
    """Sum the outside events' details (only outside events carry a lane): a few rows, however long the job."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT e.d FROM jobs_eventbatch AS b CROSS JOIN LATERAL jsonb_each(b.detail) AS e(k, d) "
            "WHERE b.job_id = %s AND e.d ? 'lane' ORDER BY b.seq_from, e.k::int",
            [job_id],
        )
        details = [json.loads(d) if isinstance(d, str) else d for (d,) in cursor.fetchall()]
    tally = OutsideTally()
    for detail in details:
        if "delta" in detail:
            tally.commits += 1
            tally.delta += int(detail["delta"])
        if detail.get("erased"):
            tally.erased += int(detail["erased"])
            tally.erased_by[detail["lane"]] = tally.erased_by.get(detail["lane"], 0) + int(detail["erased"])
        if "removed_versions" in detail:
            tally.removed_rows += 1
            tally.removed_versions += int(detail["removed_versions"])
            tally.removed_value += int(detail["removed_value"] or 0)
    return tally


def summarize(
    job: Job, params: dict[str, Any], rows: list[int], elapsed_s: float, seed: int, tally: RowTally | None = None
) -> dict[str, Any]:
    """The job's figures, counted from its stored events and checked against its rows (as `tally` read them).

    Outside writes count too: the rows should hold the job's own increments plus what the
    outside writers' writes added (after - before), so an API increment is no lost update;
    a blind outside write that lowered the value erased that much of the job's count.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT kind, count(*), coalesce(sum(duration_ms), 0) FROM jobs_event WHERE job_id = %s GROUP BY kind",
            [job.pk],
        )
        by_kind = {kind: (count, total_ms) for kind, count, total_ms in cursor.fetchall()}
        cursor.execute(
            "SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY latency_ms) "
            "FROM jobs_event WHERE job_id = %s AND kind = 'committed'",
            [job.pk],
        )
        latency = cursor.fetchone()[0]
    tally = tally or tally_rows(job.pk, params["initial_value"])
    outside = tally_outside(job.pk)

    def count(kind: str) -> int:
        return int(by_kind.get(kind, (0, 0.0))[0])

    committed = count("committed")
    conflicts = count("conflict")
    failures = conflicts + count("serialization_failure") + count("deadlock") + count("lock_timeout")
    initial_value = params["initial_value"] * len(rows)
    gained = tally.value_gained + outside.removed_value - params["initial_value"] * outside.removed_rows
    final_value = initial_value + gained
    versions_written = tally.versions_written + outside.removed_versions
    job_versions = versions_written - outside.commits
    lost = committed - (gained - outside.delta)
    strategy = params["strategy"]
    from_outside = (
        f" + {outside.delta} from {outside.commits} outside write{'s' * (outside.commits != 1)}"
        if outside.commits
        else ""
    )
    if strategy in PROTECTED:
        ok = lost == 0 and job_versions == committed
        verdict = (
            f"final {final_value} = initial {initial_value} + {committed} committed{from_outside}: no update lost"
            if ok
            else f"final {final_value} != initial {initial_value} + {committed} committed{from_outside}: "
            f"{lost} updates lost"
        )
    else:
        ok = job_versions == committed
        verdict = (
            f"{committed} blind writes committed, the value rose by {gained - outside.delta}{from_outside}: "
            f"{lost} updates lost, counted exactly (the rows' versions confirm {job_versions} writes)"
            if ok
            else f"the job counted {committed} writes but the rows' versions show {job_versions}"
        )
    if outside.erased:
        by = ", ".join(f"{n} by {lane}" for lane, n in outside.erased_by.items())
        verdict += f"; {outside.erased} increments erased by blind outside writes ({by}): lost updates"
    return {
        "strategy": strategy,
        "retry": params["retry"] if strategy in {"occ", "pessimistic", "serializable"} else None,
        "max_attempts": params["max_attempts"],
        "writers": params["writers"],
        "rows": len(rows),
        "increments": params["increments"],
        "seconds": params["seconds"],
        "think_ms": params["think_ms"],
        "seed": seed,
        "attempts": committed + failures,
        "committed": committed,
        "conflicts": conflicts,
        "retries": count("retry"),
        "gave_up": count("gave_up"),
        "serialization_failures": count("serialization_failure"),
        "deadlocks": count("deadlock"),
        "lock_timeouts": count("lock_timeout"),
        "lock_waits": count("lock_wait"),
        "lock_wait_ms": round(float(by_kind.get("lock_wait", (0, 0.0))[1]), 3),
        "errors": count("error"),
        "initial_value": initial_value,
        "final_value": final_value,
        "lost_updates": lost + outside.erased,
        "outside_writes": outside.commits,
        "outside_delta": outside.delta,
        "outside_conflicts": count("outside_conflict"),
        "lost_to_outside_blind_writes": outside.erased,
        "invariant_ok": ok,
        "invariant": verdict,
        "duration_s": round(elapsed_s, 4),
        "commits_per_s": round(committed / elapsed_s, 1) if elapsed_s > 0 else 0.0,
        "latency_ms": _percentiles(latency),
    }


def read_state(job_id: int, params: Mapping[str, Any]) -> State:
    """The job's rows (the first MAX_ROWS_SHOWN) and the updates lost so far."""
    tally = tally_rows(job_id, int(params.get("initial_value") or 0))
    if not tally.rows:
        return State({"rows": []}, {"lost_updates": None})
    rows = [
        {"id": pk, "name": row_name, "value": value, "version": version}
        for pk, row_name, value, version in tally.rows[:MAX_ROWS_SHOWN]
    ]
    # Outside writes moved versions and values by their own amounts: not lost updates, unless erased.
    outside = tally_outside(job_id)
    lost = tally.lost_updates - outside.commits + outside.delta + outside.erased
    return State({"rows": rows}, {"lost_updates": lost})


# The contended rows shown live (the sums behind lost_updates still cover all rows).
MAX_ROWS_SHOWN = 64
_FAILED_ATTEMPTS = ("conflict", "serialization_failure", "deadlock", "lock_timeout")
_CONFLICT_409 = (
    '409 Conflict: Operation cannot be fulfilled on counters "row {row}": the object has been modified; '
    "please apply your changes to the latest version and try again"
)
_OUTSIDE_409 = f"409 Conflict: {conflict_message(Counter, '{detail.name}')}"


class CounterRace(Scenario):
    name = "counter"
    title = "Counter race"
    description = "N writers increment the same rows at once: watch conflicts, retries, lock waits and lost updates."
    form_class = CounterForm
    sections = {
        "Workload": ("strategy", "writers", "increments", "seconds", "rows", "think_ms"),
        "Retry policy": ("retry", "max_attempts", "base_ms", "factor", "cap_ms"),
        "Locks and isolation": ("lock", "isolation"),
        "Starting point": ("initial_value", "seed"),
    }
    actor_label = "writer {n}"
    actors_param = "writers"
    state_keys = ("rows",)
    state_template = "scenarios/counter.html"
    state_title = "Contended rows"
    script = "occviz/scenarios/counter.js"
    kinds = (
        EventKind("read", "read", ("{who} read v{version_read} (value {value_read})",), "#8a94a6", "tick"),
        EventKind(
            "committed",
            "committed",
            (
                "{who} committed v{version_written}, blindly overwriting {detail.overwrote} newer version(s): "
                "their updates are lost",
                "{who} committed v{version_written} (value {value_read} → {value_written})",
                "{who} incremented in place: committed v{version_written} (value {value_written})",
            ),
            "#1a9e4b",
            "dot",
            ring_when="overwrote",
            ring_label="blind write over newer versions",
            writes=True,
        ),
        EventKind(
            "conflict",
            "conflict",
            ("{who}'s write matched 0 rows: conflict (it read v{version_read})",),
            "#d62828",
            "cross",
            explain=_CONFLICT_409,
            refused=True,
        ),
        EventKind(
            "retry",
            "retry wait",
            ("{who} waits {duration_ms:ms} before attempt {next_attempt}",),
            "#f08c00",
            "bar-after",
            folds_into="conflict",
            fold=", retry {next_attempt} in {duration_ms:ms}",
        ),
        EventKind(
            "lock_wait", "lock wait", ("{who} waited {duration_ms:ms} for {detail.lock}",), "#1c64d6", "bar-before"
        ),
        EventKind(
            "serialization_failure",
            "serialization failure",
            ("{who}'s transaction could not serialize access (SQLSTATE 40001)",),
            "#8b3fd9",
            "triangle",
        ),
        EventKind("gave_up", "gave up", ("{who} gave up after {attempt} attempts",), "#111111", "square"),
        EventKind(
            "deadlock", "deadlock", ("{who} was chosen as a deadlock victim (SQLSTATE 40P01)",), "#7a1010", "diamond"
        ),
        EventKind(
            "lock_timeout",
            "lock timeout",
            ("{who} timed out waiting for the lock (SQLSTATE 55P03)",),
            "#7a1010",
            "diamond",
        ),
        EventKind(
            "outside_write",
            "outside write",
            (
                "{detail.writer} via {detail.via_words}: blind write v{version_written} "
                "(value {value_read} → {value_written}), erasing {detail.erased} of the count",
                "{detail.writer} via {detail.via_words}: {detail.blind} write v{version_written} "
                "(value {value_read} → {value_written})",
                "{detail.writer} via {detail.via_words}: committed v{version_written} "
                "(value {value_read} → {value_written})",
            ),
            "#0f766e",
            "dot",
            ring_when="blind",
            ring_label="blind write (no resourceVersion)",
        ),
        outside_conflict_kind(_OUTSIDE_409),
        outside_deleted_kind("{detail.name}"),
        ERROR,
    )
    figures = (
        Figure("attempts", "attempts", count=("committed", *_FAILED_ATTEMPTS)),
        Figure("committed", "commits", count=("committed",)),
        Figure("conflicts", "conflicts", count=("conflict",)),
        Figure("retries", "retries", count=("retry",)),
        Figure("gave_up", "gave up", count=("gave_up",)),
        Figure("lock_waits", "lock waits", count=("lock_wait",)),
        Figure("lock_wait_ms", "lock wait (ms)", total_ms=("lock_wait",)),
        Figure("serialization_failures", "serialization failures", count=("serialization_failure",)),
        Figure("deadlocks", "deadlocks", count=("deadlock",)),
        Figure("lock_timeouts", "lock timeouts", count=("lock_timeout",), shown=False),
        Figure("errors", "errors", count=("error",), shown=False),
        Figure("commits_per_s", "commits/s", per_second=("committed",)),
        Figure("latency_ms", "latency p50 / p95 / p99 (ms)", percentiles=("committed",)),
        Figure("lost_updates", "lost updates", from_state=True, alarm=True),
        Figure("outside_writes", "outside writes", count=("outside_write",)),
        Figure("outside_conflicts", "outside conflicts (409)", count=("outside_conflict",)),
    )
    rates = ("committed", "conflict")
    compared = (
        ("strategy", "strategy"),
        ("retry", "retry policy"),
        ("writers", "writers"),
        ("rows", "rows"),
        ("think_ms", "think time (ms)"),
        ("attempts", "attempts"),
        ("committed", "committed"),
        ("conflicts", "conflicts"),
        ("retries", "retries"),
        ("gave_up", "gave up"),
        ("serialization_failures", "serialization failures"),
        ("lock_waits", "lock waits"),
        ("lock_wait_ms", "lock wait (ms)"),
        ("lost_updates", "lost updates"),
        ("outside_writes", "outside writes"),
        ("commits_per_s", "commits per second"),
        ("latency_ms.p50", "latency p50 (ms)"),
        ("latency_ms.p95", "latency p95 (ms)"),
        ("latency_ms.p99", "latency p99 (ms)"),
        ("duration_s", "duration (s)"),
    )
    presets = (
        Preset(
            "lost-update-demo",
            "Lost update demo",
            "Blind writes with think time: updates vanish, and the job counts them.",
            {"strategy": "none", "writers": 8, "increments": 50, "think_ms": 5},
        ),
        Preset(
            "k8s-default-backoff",
            "k8s default backoff",
            "Compare-and-swap retried with client-go's DefaultBackoff (10, 50, 250 ms; 4 steps).",
            {"strategy": "occ", "retry": "k8s-default-backoff", "writers": 8, "increments": 50, "think_ms": 2},
        ),
        Preset(
            "k8s-default-retry",
            "k8s default retry",
            "Compare-and-swap retried with client-go's DefaultRetry (10 ms, 5 steps): watch the give-ups.",
            {"strategy": "occ", "retry": "k8s-default-retry", "writers": 8, "increments": 50, "think_ms": 2},
        ),
        Preset(
            "pessimistic-lock-queue",
            "Pessimistic lock queue",
            "SELECT ... FOR UPDATE: no conflicts, writers queue on the row lock instead.",
            {"strategy": "pessimistic", "lock": "update", "writers": 8, "increments": 50, "think_ms": 2},
        ),
        Preset(
            "serializable-retries",
            "Serializable retries",
            "SERIALIZABLE transactions: PostgreSQL refuses the losers with SQLSTATE 40001, they retry.",
            {
                "strategy": "serializable",
                "isolation": "serializable",
                "retry": "k8s-default-retry",
                "max_attempts": 20,
                "writers": 8,
                "increments": 50,
                "think_ms": 2,
            },
        ),
        Preset(
            "atomic-increment",
            "Atomic increment",
            "UPDATE ... SET value = value + 1: no read-modify-write, nothing to conflict on.",
            {"strategy": "atomic", "writers": 8, "increments": 200},
        ),
    )

    def run(self, context: JobContext) -> dict[str, Any]:
        return run(context)

    def read_state(self, job_id: int, params: Mapping[str, Any]) -> State:
        return read_state(job_id, params)

    def connections(self, params: Mapping[str, Any]) -> int:
        return int(params["writers"])  # each writer has its own session

    def setup(self, params: Mapping[str, Any]) -> str:
        amount = f"{params.get('seconds')} s" if params.get("seconds") else f"{params.get('increments')} increments"
        rows = int(params.get("rows") or 1)
        line = f"{params.get('strategy')}, {params.get('writers')} writers x {amount} on {rows} row{'s' * (rows != 1)}"
        if params.get("think_ms"):
            line += f", think {params['think_ms']:g} ms"
        if params.get("strategy") in {"occ", "pessimistic", "serializable"}:
            line += f", retry {params.get('retry')}"
        return line


scenario = CounterRace()
