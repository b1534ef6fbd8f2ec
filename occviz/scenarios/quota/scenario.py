"""The quota race: the declaration (form, presets, kinds, figures).

P pods, each requesting g GPUs, are created at once against a namespace's ResourceQuota
by a pool of admission workers; a set share of the creates fail after their usage was
charged, and the quota controller repairs the leak every resync period (actors.py). A job
of it is job.py, and its verdict summary.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django import forms

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
from occviz.scenarios.quota import job
from occviz.scenarios.quota.actors import CONTROLLER, QUOTA_NAME, RESOURCE, admission_workers
from occviz.store.admission import ADMISSION_RETRIES
from occviz.store.models import ResourceQuota, conflict_message

if TYPE_CHECKING:
    from occviz.jobs.context import Actor, JobContext

MAX_PODS = 500
RESYNC_DEFAULT_S = 300.0
"""kube-controller-manager's --resource-quota-sync-period: 5 minutes."""


class QuotaForm(ScenarioForm):
    pods = WholeNumberField(min_value=1, max_value=MAX_PODS, initial=2, help_text="Pods created at once, 1 to 500.")
    hard = WholeNumberField(
        min_value=0,
        max_value=1_000_000,
        initial=1,
        label="Hard limit (GPUs)",
        help_text=f"The quota's hard {RESOURCE}.",
    )
    request = WholeNumberField(
        min_value=1, max_value=1_000, initial=1, label="Request per pod (GPUs)", help_text=f"Each pod's {RESOURCE}."
    )
    workers = WholeNumberField(
        min_value=1,
        initial=8,
        label="Admission workers",
        help_text="Creates the API server admits at once (one database connection each).",
    )
    think_ms = DecimalNumberField(
        min_value=0,
        required=False,
        initial=2.0,
        label="Admission time (ms)",
        help_text="Between reading the quota and writing it.",
    )
    create_failure_rate = DecimalNumberField(
        min_value=0.0,
        max_value=1.0,
        required=False,
        initial=0.0,
        label="Create failure rate",
        help_text="Share of admitted pods whose write fails after the quota was charged (0 to 1): the leak.",
    )
    resync_seconds = DecimalNumberField(
        min_value=1.0,
        max_value=86_400,
        required=False,
        initial=RESYNC_DEFAULT_S,
        label="Resync period (s)",
        help_text="The quota controller's full recalculation (kube-controller-manager: 300 s).",
    )
    seconds = DecimalNumberField(
        min_value=0.1,
        required=False,
        label="Run for (s)",
        help_text="Empty: until every pod is decided and any leak has been repaired by a resync.",
    )
    seed = WholeNumberField(required=False, min_value=0, max_value=2**32 - 1, help_text="Seed for the failed creates.")
    latency_ms = latency_field(
        "actor", "20 for the quota controller and every admission worker, 20 admission-1=50 for admission-1 at 50"
    )
    jitter_ms = jitter_field()
    processes = forms.CharField(
        required=False,
        initial="1",
        max_length=8,
        help_text=f'The processes the controller and the workers are spread over: 1 to {MAX_PROCESSES}, or "auto".',
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        actors = admission_workers(data) + CONTROLLER
        clean_network(self, data, actors, "actor", scenario.actor_name)
        if data.get("workers") is not None and data.get("pods") is not None:
            try:  # the controller and the admission workers: the job's actors
                data["processes"] = parse_processes(data.get("processes"), actors)
            except ValueError as refused:
                self.add_error("processes", str(refused))
        check_limit(self, "workers", data.get("workers"), "OCCVIZ_MAX_WRITERS", "admission workers")
        check_limit(self, "seconds", data.get("seconds"), "OCCVIZ_MAX_SECONDS", "seconds")
        check_limit(self, "think_ms", data.get("think_ms"), "OCCVIZ_MAX_THINK_MS", "ms of admission time")
        return data


_QUOTA_409 = f"409 Conflict: {conflict_message(ResourceQuota, QUOTA_NAME)}"
_DENIED_403 = "403 Forbidden: {detail.message}"


class QuotaRace(Scenario):
    name = "quota"
    title = "Quota race"
    description = (
        "Pods race for a namespace's GPU quota through the API server's admission: exactly `hard` are admitted; "
        "a create that fails after its charge leaks usage until the quota controller's resync repairs it."
    )
    form_class = QuotaForm
    sections = {
        "Pods and quota": ("pods", "hard", "request"),
        "The API server": ("workers", "think_ms", "create_failure_rate"),
        "The quota controller": ("resync_seconds", "seconds", "seed"),
        "Network": NETWORK_FIELDS,
        "Processes": ("processes",),
    }
    state_keys = ("quota", "actual", "pods", "gap", "bars")
    state_template = "scenarios/quota.html"
    state_title = "The ResourceQuota, and the pods that exist"
    script = "occviz/scenarios/quota.js"
    list_params = ("latency_ms",)
    controls = (latency_control("actors"),)
    kinds = (
        EventKind(
            "read",
            "read the quota",
            ("{who} read the quota for pod-{op}: used {value_read} (v{version_read})",),
            "#8a94a6",
            "tick",
        ),
        EventKind(
            "admitted",
            "admitted",
            (
                "{who} admitted pod-{op}: charged used {value_read} → {value_written} of {detail.hard} "
                "(v{version_written})",
            ),
            "#1a9e4b",
            "dot",
            writes=True,
            captions=(
                "{who} admitted pod-{op}: it charged the quota's used {value_read} → {value_written} of "
                "{detail.hard} by compare-and-swap, as the ResourceQuota admission plugin updates status.used "
                "before the pod is stored.",
            ),
            plural="admissions",
            singular="admission",
        ),
        EventKind(
            "conflict",
            "conflict",
            ("{who}'s quota write for pod-{op} matched 0 rows: conflict (it read v{version_read})",),
            "#d62828",
            "cross",
            explain=_QUOTA_409,
            refused=True,
            captions=(
                "{who}'s charge for pod-{op} matched no row: another admission charged v{version_read} first. "
                "In Kubernetes the quota's update gets 409 Conflict, and admission re-reads it.",
            ),
            plural="conflicts",
        ),
        EventKind(
            "retry",
            "retry",
            (f"{{who}} re-reads the quota for pod-{{op}}: retry {{attempt}} of {ADMISSION_RETRIES}",),
            "#f08c00",
            "triangle",
            folds_into="conflict",
            fold=f", retry {{attempt}} of {ADMISSION_RETRIES}",
            captions=(
                f"{{who}} re-reads the quota for pod-{{op}} (retry {{attempt}} of {ADMISSION_RETRIES}): the "
                "admission checks hard - used again against what is stored now.",
            ),
            plural="retries",
            singular="retry",
        ),
        EventKind(
            "denied",
            "denied (exceeded quota)",
            ("{who}: {detail.message}",),
            "#7a1010",
            "square",
            explain=_DENIED_403,
            captions=(
                "pod-{op} was refused: used {value_read} of {detail.hard} leaves no room. This is the 403 "
                "Forbidden `kubectl create` prints: exceeded quota.",
            ),
            plural="denials",
            singular="denial",
        ),
        EventKind(
            "retries_exhausted",
            "denied (conflict after retries)",
            (f"{{who}} gave up on pod-{{op}} after {ADMISSION_RETRIES} retries: {{detail.message}}",),
            "#111111",
            "square",
            captions=(
                f"pod-{{op}} was refused after {ADMISSION_RETRIES} retries that all conflicted: the create fails "
                "with the quota's 409, and the client has to create it again.",
            ),
            plural="give-ups",
            singular="give-up",
        ),
        EventKind(
            "stored",
            "pod stored",
            ("{who} stored pod-{op}: the pods that exist request {value_written}",),
            "#1c64d6",
            "dot",
            captions=(
                "pod-{op} was stored after its charge: the pods that exist now request {value_written}, and its "
                "share of used is backed by a real pod.",
            ),
            plural="pods stored",
            singular="pod stored",
        ),
        EventKind(
            "create_failed",
            "create failed (leak)",
            (
                "{who}: pod-{op}'s create failed after its quota was charged: "
                "its {value_written} stays charged until a resync",
            ),
            "#f08c00",
            "diamond",
            captions=(
                "pod-{op}'s quota was charged but the pod was never stored: its {value_written} GPU leaks until "
                "the quota controller's resync. Admission charges first, and nothing undoes it.",
            ),
            key=True,
            plural="leaks",
            singular="leak",
        ),
        EventKind(
            "resync",
            "resync repaired used",
            (
                "{who} resync {op}: {detail.pods} pods exist, {detail.in_flight} being created: used "
                "{value_read} → {value_written} (v{version_written}), {detail.released} leaked released",
            ),
            "#8b3fd9",
            "star",
            writes=True,
            captions=(
                "The quota controller's resync counted {detail.pods} pods and {detail.in_flight} being created, and "
                "repaired used {value_read} → {value_written}: {detail.released} leaked released. "
                "kube-controller-manager resyncs every 5 minutes by default.",
            ),
            key=True,
            plural="resyncs",
            singular="resync",
        ),
        EventKind(
            "resync_in_sync",
            "resync: nothing to repair",
            (
                "{who} resync {op}: used {value_read} matches {detail.pods} pods that exist and "
                "{detail.in_flight} being created",
            ),
            "#c4b5fd",
            "star",
            captions=(
                "The quota controller's resync found used {value_read} matching the {detail.pods} pods that exist "
                "and {detail.in_flight} being created: nothing to repair.",
            ),
            key=True,
            plural="resyncs",
            singular="resync",
        ),
        EventKind(
            "resync_conflict",
            "resync conflict",
            ("{who}'s repair matched 0 rows: an admission charged first (it read v{version_read}); it recalculates",),
            "#d62828",
            "cross",
            explain=_QUOTA_409,
            refused=True,
            captions=(
                "{who}'s repair matched no row: an admission charged first (it read v{version_read}). Like any "
                "client, the controller recalculates and tries again.",
            ),
            plural="resync conflicts",
        ),
        EventKind(
            "outside_charge",
            "admitted from outside",
            (
                "{detail.writer} via {detail.via_words}: a pod admitted, charged used {value_read} → {value_written} "
                "of {detail.hard} (v{version_written})",
            ),
            "#0f766e",
            "dot",
            captions=(
                "{detail.writer} created a pod via {detail.via_words}: the same admission charged used "
                "{value_read} → {value_written} of {detail.hard}.",
            ),
            key=True,
            plural="outside admissions",
            singular="outside admission",
        ),
        EventKind(
            "outside_release",
            "released from outside",
            (
                "{detail.writer} via {detail.via_words}: a pod deleted, released used {value_read} → {value_written} "
                "(v{version_written})",
            ),
            "#5eead4",
            "dot",
            captions=(
                "{detail.writer} deleted a pod via {detail.via_words}: used went {value_read} → {value_written}, "
                "released at once.",
            ),
            key=True,
            plural="outside deletions",
            singular="outside deletion",
        ),
        EventKind(
            "outside_write",
            "outside write",
            (
                "{detail.writer} via {detail.via_words}: {detail.blind} write of the quota v{version_written} "
                "(used {value_written})",
                "{detail.writer} via {detail.via_words}: wrote the quota v{version_written} (used {value_written})",
            ),
            "#0f766e",
            "tick",
            ring_when="blind",
            ring_label="blind write (no resourceVersion)",
            captions=(
                "{detail.writer} made a {detail.blind} write of the quota via {detail.via_words} (used "
                "{value_written}): without a resourceVersion, it overwrites whatever admission charged meanwhile.",
                "{detail.writer} wrote the quota via {detail.via_words} (used {value_written}) with the "
                "resourceVersion it had read: a conditional update.",
            ),
            key=True,
            plural="outside writes",
        ),
        outside_conflict_kind(_QUOTA_409),
        outside_deleted_kind("the quota", "quota deleted from outside"),
        latency_changed_kind("actors"),
        ERROR,
    )
    figures = (
        Figure("admitted", "admitted", count=("admitted",)),
        Figure("denied", "denied", count=("denied", "retries_exhausted")),
        Figure("admission_conflicts", "conflicts", count=("conflict",)),
        Figure("admission_retries", "retries", count=("retry",)),
        Figure("create_failures", "failed creates", count=("create_failed",)),
        Figure("stored_pods", "pods stored", count=("stored",)),
        Figure("resyncs", "resyncs", count=("resync", "resync_in_sync")),
        Figure("outside_admitted", "admitted from outside", count=("outside_charge",)),
        Figure("outside_conflicts", "outside conflicts (409)", count=("outside_conflict",), shown=False),
        Figure("used", "used (charged)", from_state=True),
        Figure("actual", "actually used", from_state=True),
        Figure("gap", "leaked or in flight", from_state=True, alarm=True),
        Figure("resync_conflicts", "resync conflicts", count=("resync_conflict",), shown=False),
        Figure("errors", "errors", count=("error",), shown=False),
        Figure("latency_ms", "admission latency p50 / p95 / p99 (ms)", percentiles=("admitted",)),
    )
    rates = ("admitted", "denied", "conflict")
    compared = (
        ("pods", "pods"),
        ("hard", "hard"),
        ("workers", "admission workers"),
        ("create_failure_rate", "create failure rate"),
        ("resync_seconds", "resync period (s)"),
        ("admitted", "admitted"),
        ("denied", "denied"),
        ("admission_conflicts", "conflicts"),
        ("admission_retries", "retries"),
        ("create_failures", "failed creates"),
        ("leaked", "leaked"),
        ("resyncs", "resyncs"),
        ("used_final", "used at the end"),
        ("actual_final", "actually used at the end"),
        ("over_admitted", "over-admitted"),
        ("duration_s", "duration (s)"),
        *NETWORK_COMPARED,
    )
    presets = (
        Preset(
            "two-pods-one-gpu",
            "Two pods, one GPU",
            "Two pods ask for the quota's only GPU at once: one is admitted, the other re-reads and is denied.",
            {"pods": 2, "hard": 1, "request": 1, "workers": 2, "think_ms": 1500, "seconds": 6},
        ),
        Preset(
            "hundred-pods-ten-slots",
            "A hundred pods for ten slots",
            "100 pods race for 10 GPUs through 8 admission workers: conflicts and retries, exactly 10 admitted.",
            {"pods": 100, "hard": 10, "request": 1, "workers": 8, "think_ms": 100, "seconds": 10},
        ),
        Preset(
            "leak-and-repair",
            "Leak and repair",
            "A fifth of the creates fail after their charge: used stays above what exists until the resync at 2 s.",
            {
                "pods": 60,
                "hard": 40,
                "request": 1,
                "workers": 4,
                "think_ms": 20,
                "create_failure_rate": 0.2,
                "resync_seconds": 2,
                "seconds": 5,
            },
        ),
    )

    def run(self, context: JobContext) -> dict[str, Any]:
        return job.run(context)

    def read_state(self, job_id: int, params: Mapping[str, Any]) -> State:
        return job.read_state(job_id, params)

    def shard_actors(self, context: JobContext, plan: Mapping[str, Any]) -> list[Actor]:
        return job.shard_actors(context, plan)

    def actor_names(self, params: Mapping[str, Any]) -> list[str]:
        return [self.actor_name(n) for n in range(1, admission_workers(params) + CONTROLLER + 1)]

    def actor_name(self, number: int) -> str:
        return "quota-controller" if number == CONTROLLER else f"admission-{number - CONTROLLER}"

    def setup(self, params: Mapping[str, Any]) -> str:
        line = (
            f"{params.get('pods')} pods x {params.get('request')} GPU against hard {params.get('hard')}, "
            f"{admission_workers(params)} admission workers"
        )
        if params.get("create_failure_rate"):
            line += f", {params['create_failure_rate']:g} of creates fail"
        line += f", resync every {float(params.get('resync_seconds') or RESYNC_DEFAULT_S):g} s"
        if params.get("seconds"):
            line += f", {params['seconds']:g} s"
        return line + network_setup(params)


scenario = QuotaRace()
