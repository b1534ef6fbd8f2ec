"""The counter race: N writers x M increments (or S seconds) over K counter rows.

The declaration: its parameters, presets, event kinds and figures. A job of it is
job.py, the five strategies its writers use are actors.py, and its verdict is summary.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django import forms
from django.conf import settings

from occviz.concurrency.retry import LARGEST_FACTOR, LONGEST_WAIT_MS, PRESETS
from occviz.jobs.shards import MAX_PROCESSES, parse_processes
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
from occviz.scenarios.counter import job
from occviz.scenarios.counter.actors import STRATEGIES
from occviz.scenarios.counter.summary import FAILED_ATTEMPTS
from occviz.scenarios.network import (
    NETWORK_COMPARED,
    NETWORK_FIELDS,
    clean_network,
    jitter_field,
    latency_changed_kind,
    latency_control,
    latency_field,
    network_setup,
)
from occviz.scenarios.outside import outside_conflict_kind, outside_deleted_kind
from occviz.store.models import Counter, conflict_message

if TYPE_CHECKING:
    from occviz.jobs.context import Actor, JobContext

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
    latency_ms = latency_field("writer", "20 for every writer, 20 2=50 for writer 2 at 50")
    jitter_ms = jitter_field()
    processes = forms.CharField(
        required=False,
        initial="1",
        max_length=8,
        label='Processes (or "auto")',
        help_text=f"1: every writer in the job's one process. 2 to {MAX_PROCESSES}: the writers shared out among "
        "that many processes, each taken by a free worker, or started by the job's own when none is free. "
        '"auto": one per core, at most one per writer.',
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        try:
            data["processes"] = parse_processes(data.get("processes"), data.get("writers"))
        except ValueError as refused:
            self.add_error("processes", str(refused))
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
        clean_network(self, data, data.get("writers"), "writer", scenario.actor_name)
        if data.get("increments") and data.get("think_ms") and not self.errors:
            floor_s = data["increments"] * data["think_ms"] / 1000.0
            if floor_s > settings.OCCVIZ_MAX_SECONDS:
                self.add_error(
                    "think_ms",
                    f"{data['increments']} increments with {data['think_ms']:g} ms of think time take at least "
                    f"{floor_s:.0f} s, more than the {settings.OCCVIZ_MAX_SECONDS} s a job may run.",
                )
        return data


# What the API server answers the loser of a race on a row (detail.name: the row's name).
_CONFLICT_409 = f"409 Conflict: {conflict_message(Counter, '{detail.name}')}"


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
        "Network": NETWORK_FIELDS,
        "Processes": ("processes",),
    }
    actor_label = "writer {n}"
    actors_param = "writers"
    list_params = ("latency_ms",)
    controls = (latency_control("writers"),)
    state_keys = ("rows",)
    state_template = "scenarios/counter.html"
    state_title = "Contended rows"
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
            captions=(
                "{who} wrote v{version_written} blindly over {detail.overwrote} newer version(s): their increments "
                "are lost. In Kubernetes, an update without resourceVersion: last write wins, silently.",
                "{who} committed v{version_written} (value {value_read} → {value_written}): no other write landed "
                "between its read and its write. In Kubernetes, 200 OK.",
                "{who} incremented in place (v{version_written}, value {value_written}): nothing was read first, so "
                "nothing can conflict; the database adds 1 to whatever is stored.",
            ),
            plural="commits",
            singular="commit",
        ),
        EventKind(
            "conflict",
            "conflict",
            ("{who}'s write matched 0 rows: conflict (it read v{version_read})",),
            "#d62828",
            "cross",
            explain=_CONFLICT_409,
            refused=True,
            captions=(
                "{who}'s update matched no row: v{version_read}, the version it read, is gone. In Kubernetes this "
                "is the 409 Conflict `kubectl apply` prints: the object has been modified.",
            ),
            plural="conflicts",
        ),
        EventKind(
            "retry",
            "retry wait",
            ("{who} waits {duration_ms:ms} before attempt {next_attempt}",),
            "#f08c00",
            "bar-after",
            folds_into="conflict",
            fold=", retry {next_attempt} in {duration_ms:ms}",
            captions=(
                "{who} backs off {duration_ms:ms}, then reads again for attempt {next_attempt}: client-go's "
                "retry.RetryOnConflict, waiting longer after each 409.",
            ),
            plural="retries",
            singular="retry",
        ),
        EventKind(
            "lock_wait",
            "lock wait",
            ("{who} waited {duration_ms:ms} for {detail.lock}",),
            "#1c64d6",
            "bar-before",
            captions=(
                "{who} queued {duration_ms:ms} for the row lock ({detail.lock}): no conflict, a wait. The API "
                "server takes no locks: etcd refuses a stale write instead of queueing it.",
            ),
            plural="lock waits",
        ),
        EventKind(
            "serialization_failure",
            "serialization failure",
            ("{who}'s transaction could not serialize access (SQLSTATE 40001)",),
            "#8b3fd9",
            "triangle",
            captions=(
                "{who}'s transaction was refused by PostgreSQL (SQLSTATE 40001, could not serialize access): "
                "the database's own conflict, retried as a 409 is.",
            ),
            plural="serialization failures",
        ),
        EventKind(
            "gave_up",
            "gave up",
            ("{who} gave up after {attempt} attempts",),
            "#111111",
            "square",
            captions=(
                "{who} gave up after {attempt} attempts: its increment is not made. RetryOnConflict hands the "
                "last 409 back to its caller once the backoff's steps run out.",
            ),
            plural="give-ups",
            singular="give-up",
        ),
        EventKind(
            "deadlock",
            "deadlock",
            ("{who} was chosen as a deadlock victim (SQLSTATE 40P01)",),
            "#7a1010",
            "diamond",
            captions=(
                "{who} was PostgreSQL's deadlock victim (SQLSTATE 40P01): two writers each held the row FOR SHARE "
                "and waited for the other to write. The API server takes no locks, so never this.",
            ),
            plural="deadlocks",
        ),
        EventKind(
            "lock_timeout",
            "lock timeout",
            ("{who} timed out waiting for the lock (SQLSTATE 55P03)",),
            "#7a1010",
            "diamond",
            captions=("{who} waited past lock_timeout for the row lock (SQLSTATE 55P03), and tries again.",),
            plural="lock timeouts",
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
            captions=(
                "{detail.writer} wrote the counter via {detail.via_words} without a resourceVersion, erasing "
                "{detail.erased} of the count: an unconditional update overwrites whatever is stored.",
                "{detail.writer} made a {detail.blind} write of the counter via {detail.via_words} (value "
                "{value_read} → {value_written}): without a resourceVersion, it is accepted whatever is stored.",
                "{detail.writer} wrote the counter via {detail.via_words} with the resourceVersion it had read "
                "(value {value_read} → {value_written}): a conditional update, as a careful client sends.",
            ),
            key=True,
            plural="outside writes",
        ),
        latency_changed_kind("writers"),
        outside_conflict_kind(_CONFLICT_409),
        outside_deleted_kind("{detail.name}"),
        ERROR,
    )
    figures = (
        Figure("attempts", "attempts", count=("committed", *FAILED_ATTEMPTS)),
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
        *NETWORK_COMPARED,
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
            {"strategy": "none", "writers": 8, "seconds": 8, "think_ms": 20},
        ),
        Preset(
            "k8s-default-backoff",
            "k8s default backoff",
            "Compare-and-swap retried with client-go's DefaultBackoff (10, 50, 250 ms; 4 steps).",
            {"strategy": "occ", "retry": "k8s-default-backoff", "writers": 8, "seconds": 8, "think_ms": 10},
        ),
        Preset(
            "k8s-default-retry",
            "k8s default retry",
            "Compare-and-swap retried with client-go's DefaultRetry (10 ms, 5 steps): watch the give-ups.",
            {"strategy": "occ", "retry": "k8s-default-retry", "writers": 8, "seconds": 8, "think_ms": 10},
        ),
        Preset(
            "pessimistic-lock-queue",
            "Pessimistic lock queue",
            "SELECT ... FOR UPDATE: no conflicts, writers queue on the row lock instead.",
            {"strategy": "pessimistic", "lock": "update", "writers": 8, "seconds": 8, "think_ms": 10},
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
                "seconds": 8,
                "think_ms": 10,
            },
        ),
        Preset(
            "atomic-increment",
            "Atomic increment",
            "UPDATE ... SET value = value + 1: no read-modify-write, nothing to conflict on.",
            {"strategy": "atomic", "writers": 8, "seconds": 8, "think_ms": 10},
        ),
    )

    def run(self, context: JobContext) -> dict[str, Any]:
        return job.run(context)

    def read_state(self, job_id: int, params: Mapping[str, Any]) -> State:
        return job.read_state(job_id, params)

    def shard_actors(self, context: JobContext, plan: Mapping[str, Any]) -> list[Actor]:
        return job.shard_actors(context, plan)

    def connections(self, params: Mapping[str, Any]) -> int:
        return int(params["writers"])  # each writer has its own session

    def tag(self, params: Mapping[str, Any]) -> str:
        return str(params.get("strategy") or "")

    def setup(self, params: Mapping[str, Any]) -> str:
        amount = f"{params.get('seconds')} s" if params.get("seconds") else f"{params.get('increments')} increments"
        rows = int(params.get("rows") or 1)
        line = f"{params.get('strategy')}, {params.get('writers')} writers x {amount} on {rows} row{'s' * (rows != 1)}"
        if params.get("think_ms"):
            line += f", think {params['think_ms']:g} ms"
        if params.get("strategy") in {"occ", "pessimistic", "serializable"}:
            line += f", retry {params.get('retry')}"
        return line + network_setup(params)


scenario = CounterRace()
