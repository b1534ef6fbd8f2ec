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

import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django import forms
from django.conf import settings
from django.db import connection

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
from occviz.store.models import Counter

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

    context.run_actors([writer_actor(n) for n in range(1, params["writers"] + 1)], time_limit_s=limit_s)
    return summarize(job, params, rows, context.elapsed_s, seed)


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


def summarize(job: Job, params: dict[str, Any], rows: list[int], elapsed_s: float, seed: int) -> dict[str, Any]:
    """The job's figures, counted from its stored events and checked against its rows."""
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
    tally = tally_rows(job.pk, params["initial_value"])

    def count(kind: str) -> int:
        return int(by_kind.get(kind, (0, 0.0))[0])

    committed = count("committed")
    conflicts = count("conflict")
    failures = conflicts + count("serialization_failure") + count("deadlock") + count("lock_timeout")
    initial_value = params["initial_value"] * len(rows)
    gained = tally.value_gained
    final_value = initial_value + gained
    versions_written = tally.versions_written
    lost = committed - gained
    strategy = params["strategy"]
    if strategy in PROTECTED:
        ok = lost == 0 and versions_written == committed
        verdict = (
            f"final {final_value} = initial {initial_value} + {committed} committed: no update lost"
            if ok
            else f"final {final_value} != initial {initial_value} + {committed} committed: {lost} updates lost"
        )
    else:
        ok = versions_written == committed
        verdict = (
            f"{committed} blind writes committed, the value rose by {gained}: {lost} updates lost, "
            f"counted exactly (the rows' versions confirm {versions_written} writes)"
            if ok
            else f"the job counted {committed} writes but the rows' versions show {versions_written}"
        )
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
        "lost_updates": lost,
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
    return State({"rows": rows}, {"lost_updates": tally.lost_updates})


# The contended rows shown live (the sums behind lost_updates still cover all rows).
MAX_ROWS_SHOWN = 64
_FAILED_ATTEMPTS = ("conflict", "serialization_failure", "deadlock", "lock_timeout")
_CONFLICT_409 = (
    '409 Conflict: Operation cannot be fulfilled on counters "row {row}": the object has been modified; '
    "please apply your changes to the latest version and try again"
)


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
        ),
        EventKind(
            "conflict",
            "conflict",
            ("{who}'s write matched 0 rows: conflict (it read v{version_read})",),
            "#d62828",
            "cross",
            explain=_CONFLICT_409,
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
