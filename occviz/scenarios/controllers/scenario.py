"""Controllers A and B: 2..8 controllers reconcile one Deployment, each owning a different field.

The declaration: its parameters, presets, event kinds and figures. Each controller, at its
rate, GETs the object, thinks, sets its own field and writes the whole object back
(actors.py); `History` follows the object version by version and says which write erased
which (history.py); a job of it is job.py, and its verdict summary.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django import forms

from occviz.concurrency.retry import PRESETS
from occviz.jobs.shards import MAX_PROCESSES, parse_processes, processes_of
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
from occviz.scenarios.controllers import job
from occviz.scenarios.controllers.deployment import MAX_CONTROLLERS, MIN_CONTROLLERS, OBJECT_NAME, controller_name
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
from occviz.store.models import Deployment, conflict_message

if TYPE_CHECKING:
    from occviz.jobs.context import Actor, JobContext

MAX_RATE_PER_S = 200
MAX_THINK_MS = 1000
STRATEGIES = ("occ", "none")


class ControllersForm(ScenarioForm):
    strategy = forms.ChoiceField(
        choices=[(s, s) for s in STRATEGIES],
        initial="occ",
        help_text="occ: compare-and-swap, re-GET and retry on conflict; none: blind whole-object writes.",
    )
    controllers = WholeNumberField(
        min_value=MIN_CONTROLLERS, max_value=MAX_CONTROLLERS, initial=2, help_text="2 to 8, each owning a field."
    )
    seconds = DecimalNumberField(min_value=0.5, initial=10.0, help_text="How long the controllers run.")
    rate_per_s = DecimalNumberField(
        min_value=0.1,
        max_value=MAX_RATE_PER_S,
        initial=20.0,
        label="Rate (/s)",
        help_text="Reconciles per second, each.",
    )
    think_ms = DecimalNumberField(
        min_value=0,
        max_value=MAX_THINK_MS,
        required=False,
        initial=5.0,
        label="Think time (ms)",
        help_text="Between the GET and the write: the window another controller's write lands in.",
    )
    retry = forms.ChoiceField(
        choices=[(p, p) for p in PRESETS],
        required=False,
        initial="k8s-default-retry",
        help_text="occ only: client-go's RetryOnConflict uses DefaultRetry (5 steps of 10 ms, jitter 0.1).",
    )
    max_attempts = WholeNumberField(min_value=1, required=False, help_text="Default: the retry policy's steps.")
    seed = WholeNumberField(required=False, min_value=0, max_value=2**32 - 1, help_text="Seed for the jitter.")
    latency_ms = latency_field("controller", "20 for every controller, 20 2=50 for controller B at 50")
    jitter_ms = jitter_field()
    processes = forms.CharField(
        required=False,
        initial="1",
        max_length=8,
        help_text=f'The processes its controllers are spread over: 1 to {MAX_PROCESSES}, or "auto" (one per core).',
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        clean_network(self, data, data.get("controllers"), "controller", controller_name)
        if data.get("controllers") is not None:
            try:
                data["processes"] = parse_processes(data.get("processes"), data["controllers"])
            except ValueError as refused:
                self.add_error("processes", str(refused))
        check_limit(self, "controllers", data.get("controllers"), "OCCVIZ_MAX_WRITERS", "controllers")
        check_limit(self, "seconds", data.get("seconds"), "OCCVIZ_MAX_SECONDS", "seconds")
        check_limit(self, "think_ms", data.get("think_ms"), "OCCVIZ_MAX_THINK_MS", "ms of think time")
        check_limit(self, "max_attempts", data.get("max_attempts"), "OCCVIZ_MAX_ATTEMPTS", "attempts")
        return data


_CONFLICT_409 = f"409 Conflict: {conflict_message(Deployment, OBJECT_NAME)}"


class Controllers(Scenario):
    name = "controllers"
    title = "Controller race"
    description = (
        "Controllers A and B (up to H) reconcile the same Deployment, each owning a field: with occ a conflict "
        "is re-read and re-applied, with blind writes one controller silently erases another's work."
    )
    form_class = ControllersForm
    sections = {
        "Controllers": ("strategy", "controllers", "seconds", "rate_per_s", "think_ms"),
        "Retry on conflict": ("retry", "max_attempts"),
        "Starting point": ("seed",),
        "Network": NETWORK_FIELDS,
        "Processes": ("processes",),
    }
    actor_label = "controller {n}"
    actors_param = "controllers"
    state_keys = ("deployment", "controllers")
    state_template = "scenarios/controllers.html"
    state_title = "The Deployment"
    script = "occviz/scenarios/controllers.js"
    list_params = ("latency_ms",)
    controls = (latency_control("controllers"),)
    kinds = (
        EventKind("read", "GET", ("{who} GET v{version_read}",), "#8a94a6", "tick"),
        EventKind(
            "committed",
            "write",
            (
                "{who} set {detail.field} = {value_written} with a blind write v{version_read} → v{version_written}, "
                "over {detail.overwrote} newer version(s)",
                "{who} set {detail.field} = {value_written}: v{version_read} → v{version_written}",
            ),
            "#1a9e4b",
            "dot",
            ring_when="overwrote",
            ring_label="blind write over newer versions",
            writes=True,
            captions=(
                "{who} set {detail.field} = {value_written} by writing back the whole object it read at "
                "v{version_read}, over {detail.overwrote} newer version(s): an update without resourceVersion.",
                "{who} set {detail.field} = {value_written} (v{version_read} → v{version_written}): nothing had "
                "changed since its GET, so its update of the whole object was accepted.",
            ),
            plural="writes",
            singular="write",
        ),
        EventKind(
            "conflict",
            "conflict",
            ("{who}'s update conflicted: it had read v{version_read}",),
            "#d62828",
            "cross",
            explain=_CONFLICT_409,
            refused=True,
            captions=(
                "{who}'s update matched no row: v{version_read}, the version it read, is gone. In Kubernetes this "
                "is the 409 Conflict a controller's Update gets: the object has been modified.",
            ),
            plural="conflicts",
        ),
        EventKind(
            "retry",
            "retry wait",
            ("{who} waits {duration_ms:ms}, then GETs again and re-applies (attempt {next_attempt})",),
            "#f08c00",
            "bar-after",
            folds_into="conflict",
            fold=", re-GET and re-apply in {duration_ms:ms}",
            captions=(
                "{who} waits {duration_ms:ms}, GETs the Deployment again and re-applies its one field: client-go's "
                "retry.RetryOnConflict, so the other controller's change survives.",
            ),
            plural="retries",
            singular="retry",
        ),
        EventKind(
            "gave_up",
            "gave up",
            ("{who} gave up after {attempt} attempts",),
            "#111111",
            "square",
            captions=(
                "{who} gave up after {attempt} attempts: RetryOnConflict returns the last 409, and a controller "
                "requeues the object to reconcile it later.",
            ),
            plural="give-ups",
            singular="give-up",
        ),
        EventKind(
            "erased",
            "erased",
            (
                "{who}'s write v{version_written} erased {detail.victim}'s {detail.field} = {value_read} "
                "(set at v{detail.set_at}): back to {value_written}",
            ),
            "#b5179e",
            "star",
            captions=(
                "{who}'s write v{version_written} erased {detail.victim}'s {detail.field} = {value_read}: it wrote "
                "back the whole object as read before v{detail.set_at}. A blind update loses a field, silently.",
            ),
            key=True,
            plural="erased fields",
            singular="erased field",
        ),
        EventKind(
            "outside_write",
            "outside write",
            (
                "{detail.writer} via {detail.via_words}: {detail.blind} write v{version_written}, "
                "changing {detail.changed}",
                "{detail.writer} via {detail.via_words}: wrote v{version_read} → v{version_written}, "
                "changing {detail.changed}",
            ),
            "#0f766e",
            "dot",
            ring_when="blind",
            ring_label="blind write (no resourceVersion)",
            captions=(
                "{detail.writer} made a {detail.blind} write of the Deployment via {detail.via_words}, changing "
                "{detail.changed}: without a resourceVersion, as `kubectl replace` of a file that has none.",
                "{detail.writer} updated the Deployment via {detail.via_words} (v{version_read} → v{version_written}), "
                "changing {detail.changed}, with the resourceVersion it had read.",
            ),
            key=True,
            plural="outside writes",
        ),
        EventKind(
            "outside_erased",
            "erased from outside",
            (
                "{who}'s write v{version_written} erased {detail.victim}'s {detail.field} = {value_read} "
                "(set at v{detail.set_at}): now {value_written}",
            ),
            "#7c3aed",
            "star",
            captions=(
                "{who}'s write v{version_written} erased {detail.victim}'s {detail.field} = {value_read} (set at "
                "v{detail.set_at}): an outside update of a stale copy, now {value_written}.",
            ),
            key=True,
            plural="fields erased from outside",
            singular="field erased from outside",
        ),
        outside_conflict_kind(_CONFLICT_409),
        outside_deleted_kind("the Deployment"),
        latency_changed_kind("controllers"),
        ERROR,
    )
    figures = (
        Figure("writes", "writes", count=("committed",)),
        Figure("conflicts", "conflicts", count=("conflict",)),
        Figure("retries", "retries", count=("retry",)),
        Figure("gave_up", "gave up", count=("gave_up",)),
        Figure("lost_fields", "fields erased", count=("erased",), alarm=True),
        Figure("outside_writes", "outside writes", count=("outside_write",)),
        Figure("erased_from_outside", "erased from outside", count=("outside_erased",)),
        Figure("outside_conflicts", "outside conflicts (409)", count=("outside_conflict",), shown=False),
        Figure("errors", "errors", count=("error",), shown=False),
        Figure("writes_per_s", "writes/s", per_second=("committed",)),
        Figure("latency_ms", "latency p50 / p95 / p99 (ms)", percentiles=("committed",)),
    )
    rates = ("committed", "conflict", "erased")
    compared = (
        ("strategy", "strategy"),
        ("controllers", "controllers"),
        ("rate_per_s", "rate (/s each)"),
        ("think_ms", "think time (ms)"),
        ("writes", "writes"),
        ("conflicts", "conflicts"),
        ("retries", "retries"),
        ("gave_up", "gave up"),
        ("lost_fields", "fields erased"),
        ("writes_per_s", "writes per second"),
        ("latency_ms.p50", "latency p50 (ms)"),
        ("latency_ms.p99", "latency p99 (ms)"),
        ("duration_s", "duration (s)"),
        *NETWORK_COMPARED,
    )
    presets = (
        Preset(
            "two-occ",
            "Two controllers, occ",
            "A and B conflict, re-GET and re-apply their change: neither field is lost.",
            {"strategy": "occ", "controllers": 2, "rate_per_s": 50, "think_ms": 5, "seconds": 10},
        ),
        Preset(
            "two-none",
            "Two controllers, none (lost fields)",
            "A and B write back the whole object they read: each silently erases the other's field.",
            {"strategy": "none", "controllers": 2, "rate_per_s": 50, "think_ms": 5, "seconds": 10},
        ),
        Preset(
            "eight-occ",
            "Eight controllers",
            "Eight controllers on one object: conflicts and retries climb, still nothing lost.",
            {"strategy": "occ", "controllers": 8, "rate_per_s": 20, "think_ms": 5, "seconds": 15},
        ),
    )

    def run(self, context: JobContext) -> dict[str, Any]:
        return job.run(context)

    def read_state(self, job_id: int, params: Mapping[str, Any]) -> State:
        return job.read_state(job_id, params)

    def shard_actors(self, context: JobContext, plan: Mapping[str, Any]) -> list[Actor]:
        return job.shard_actors(context, plan)

    def connections(self, params: Mapping[str, Any]) -> int:
        # Over several processes, the first also follows the controllers' stored writes on a connection of its own.
        return super().connections(params) + (1 if processes_of(params) > 1 else 0)

    def actor_name(self, number: int) -> str:
        return controller_name(number)

    def tag(self, params: Mapping[str, Any]) -> str:
        return str(params.get("strategy") or "")

    def setup(self, params: Mapping[str, Any]) -> str:
        line = (
            f"{params.get('strategy')}, {params.get('controllers')} controllers at {params.get('rate_per_s'):g}/s "
            f"for {params.get('seconds'):g} s"
        )
        if params.get("think_ms"):
            line += f", think {params['think_ms']:g} ms"
        if params.get("strategy") == "occ":
            line += f", retry {params.get('retry')}"
        return line + network_setup(params)


scenario = Controllers()
