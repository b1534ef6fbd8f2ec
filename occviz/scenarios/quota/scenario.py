"""The quota race: what the rest of the app knows of it (form, presets, kinds, figures, state, summary).

P pods, each requesting g GPUs, are created at once against a namespace's
ResourceQuota by a pool of admission workers (admission.py); a set share of the creates
fail after their usage was charged, and the quota controller repairs the leak every
resync period. The job checks that admitted usage never exceeded `hard` and that, once
no admission was under way, a resync left `used` equal to what the pods that exist request.

Pods created and deleted over the HTTP API in the job's namespace go through the same
admission (occviz.store.admission) and contend for the same quota row: their writes to the
quota are followed as events on a lane named after their writer, their pods count as pods
that exist, and their charges and releases count in the admitted usage the verdict checks.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection, transaction

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
from occviz.scenarios.outside import Payload, outside_conflict_kind, outside_deleted_kind, outside_write
from occviz.scenarios.quota.admission import (
    CONTROLLER,
    QUOTA_NAME,
    RESOURCE,
    Admission,
    ChargeLedger,
    QuotaController,
    quantity,
)
from occviz.store.admission import ADMISSION_RETRIES
from occviz.store.models import ResourceQuota, conflict_message

if TYPE_CHECKING:
    from occviz.jobs.context import JobContext

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

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        check_limit(self, "workers", data.get("workers"), "OCCVIZ_MAX_WRITERS", "admission workers")
        check_limit(self, "seconds", data.get("seconds"), "OCCVIZ_MAX_SECONDS", "seconds")
        check_limit(self, "think_ms", data.get("think_ms"), "OCCVIZ_MAX_THINK_MS", "ms of admission time")
        return data


def _workers(params: Mapping[str, Any]) -> int:
    return min(int(params["workers"]), int(params["pods"]))


def run(context: JobContext) -> dict[str, Any]:
    job, params = context.job, context.params
    namespace = f"job-{job.pk}"
    quota = ResourceQuota.objects.create(
        namespace=namespace, name=QUOTA_NAME, hard={RESOURCE: params["hard"]}, used={RESOURCE: 0}, job=job
    )
    seed = params["seed"] if params.get("seed") is not None else random.randrange(2**32)
    ledger = ChargeLedger(params["hard"])
    admission = Admission(
        job_id=job.pk,
        namespace=namespace,
        quota_id=quota.pk,
        pods=params["pods"],
        request=params["request"],
        think_ms=params["think_ms"],
        failure_rate=params["create_failure_rate"],
        seed=seed,
        recorder=context.recorder,
        stop=context.stop,
        ledger=ledger,
    )
    seconds = params.get("seconds")
    controller = QuotaController(admission, params["resync_seconds"], until_repaired=seconds is None)
    workers = [admission.worker(CONTROLLER + n) for n in range(1, _workers(params) + 1)]
    lanes = iter(range(_workers(params) + CONTROLLER + 1, 2**31))
    context.on_outside_write(
        lambda payload: record_outside_write(context, quota.pk, payload), next_actor=lanes.__next__
    )
    context.run_actors([controller.run, *workers], time_limit_s=float(seconds or settings.OCCVIZ_MAX_SECONDS))
    with transaction.atomic():
        # The quota locked while the last outside writes are handed over: none lands between them and the summary's.
        list(ResourceQuota.objects.filter(pk=quota.pk).select_for_update().values_list("pk"))
        context.settle_outside_writes()
    context.recorder.flush()
    return summarize(job.pk, params, ledger, context.elapsed_s, seed)


def record_outside_write(context: JobContext, quota_id: int, payload: Payload) -> None:
    """A write to the job's quota from outside (an API pod's admission or release, a kubectl edit), on its lane.

    value_read/value_written: `used` before and after; detail.delta (after - before) is a
    charge when positive, a release when negative: the summary counts them as admitted usage.
    """
    if payload.get("resource") != ResourceQuota.kind_plural or payload.get("object_id") != quota_id:
        return
    write = outside_write(context, payload)
    before, after = quantity(write.before.get("used")), quantity(write.after.get("used"))
    detail = dict(write.detail, hard=quantity(write.after.get("hard")))
    fields: dict[str, Any] = {"version_read": write.version_read, "value_read": before}
    if write.type == "MODIFIED":
        detail["delta"] = after - before
        kind = "outside_charge" if after > before else "outside_release" if after < before else "outside_write"
        fields.update(version_written=write.version_written, value_written=after)
    elif write.type == "CONFLICT":
        kind = "outside_conflict"
        fields.update(value_written=after)
    elif write.type == "DELETED":
        kind = "outside_deleted"
    else:
        return
    context.recorder.record(write.actor, 0, 1, kind, quota_id, detail=detail, **fields)


def _counts(job_id: int) -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT kind, count(*) FROM jobs_event WHERE job_id = %s GROUP BY kind", [job_id])
        return {kind: int(count) for kind, count in cursor.fetchall()}


def _resyncs(job_id: int) -> list[dict[str, Any]]:
    """The controller's recalculations that ended (repaired, or found nothing to repair), in order."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT kind, value_read, value_written, detail FROM jobs_event "
            "WHERE job_id = %s AND kind IN ('resync', 'resync_in_sync') ORDER BY seq",
            [job_id],
        )
        return [
            {"kind": kind, "used_before": before, "used_after": after, **_detail(detail)}
            for kind, before, after, detail in cursor.fetchall()
        ]


def _detail(detail: Any) -> dict[str, Any]:
    # The events view gives detail back as JSON text through Django's cursor.
    return json.loads(detail) if isinstance(detail, str) else dict(detail or {})


def stored(job_id: int) -> tuple[int, int]:
    """(quota's used, what the pods that exist in its namespace request, the job's and the API's), as stored now."""
    quota = ResourceQuota.objects.filter(job_id=job_id, name=QUOTA_NAME).values_list("used", "namespace").first()
    used, namespace = quota if quota is not None else (None, f"job-{job_id}")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum((requests ->> %s)::bigint), 0) FROM store_pod WHERE namespace = %s",
            [RESOURCE, namespace],
        )
        actual = int(cursor.fetchone()[0])
    return quantity(used), actual


def peak_admitted(job_id: int) -> int:
    """The most usage admitted pods held at once, the job's and the API's, in the order of the quota's versions.

    Every charge and release is a write of the quota, so its version orders them all, whenever
    the outside ones were handed to the job. A charge whose pod's create failed is left out (it
    never held anything); a resync's write is neither.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT kind, op, version_written, value_read, value_written, detail FROM jobs_event "
            "WHERE job_id = %s AND kind IN ('admitted', 'create_failed', 'outside_charge', 'outside_release')",
            [job_id],
        )
        rows = cursor.fetchall()
    failed = {op for kind, op, *_ in rows if kind == "create_failed"}
    changes = []
    for kind, op, version, before, after, detail in rows:
        if kind == "admitted" and op not in failed:
            changes.append((int(version), int(after) - int(before)))
        elif kind.startswith("outside_"):
            changes.append((int(version), int(_detail(detail)["delta"])))
    held = peak = 0
    for _, delta in sorted(changes):
        held += delta
        peak = max(peak, held)
    return peak


def summarize(
    job_id: int, params: Mapping[str, Any], ledger: ChargeLedger, elapsed_s: float, seed: int
) -> dict[str, Any]:
    """The job's figures from its stored events and objects, and the invariant's verdict."""
    counts = _counts(job_id)
    resyncs = _resyncs(job_id)
    used_final, actual_final = stored(job_id)
    hard = int(params["hard"])
    repairs = [resync for resync in resyncs if resync["kind"] == "resync" and resync.get("released", 0) > 0]
    gap = used_final - actual_final
    leaked = gap if gap > 0 or not repairs else int(repairs[-1]["released"])
    # A resync with nothing under way: the one check of `used` against what exists that must hold exactly.
    quiet = [resync for resync in resyncs if not resync["admitting"] and not resync["in_flight"]]
    quiet_wrong = [resync for resync in quiet if resync["used_after"] != resync["exists"]]
    most_held = max(ledger.most_held, peak_admitted(job_id))
    over_admitted = max(ledger.over_admitted, most_held - hard, actual_final - hard, 0)
    outside_admitted, outside_released = counts.get("outside_charge", 0), counts.get("outside_release", 0)
    denied_exceeded = counts.get("denied", 0)
    denied_conflicts = counts.get("retries_exhausted", 0)
    ends_settled = bool(quiet) and gap == 0
    parts = []
    counting = (
        f", counting {outside_admitted} admitted and {outside_released} released from outside"
        if outside_admitted or outside_released
        else ""
    )
    if over_admitted:
        parts.append(f"admitted usage reached {most_held} of hard {hard}{counting}: {over_admitted} over")
    else:
        parts.append(f"admitted usage never exceeded hard {hard} (at most {most_held}{counting})")
    if quiet_wrong:
        wrong = quiet_wrong[0]
        parts.append(
            f"a resync with nothing in flight left used {wrong['used_after']} for {wrong['exists']} that exist"
        )
    elif quiet:
        parts.append(f"after the last quiet resync used {quiet[-1]['used_after']} = what exists")
    if gap > 0 and not quiet_wrong:
        parts.append(
            f"a leak of {gap} stands (used {used_final}, pods that exist request {actual_final}): "
            f"no resync after it within the job (period {params['resync_seconds']:g} s)"
        )
    elif repairs:
        parts.append(f"the resync released {repairs[-1]['released']} leaked")
    ok = over_admitted == 0 and not quiet_wrong
    return {
        "pods": params["pods"],
        "hard": hard,
        "request": params["request"],
        "resource": RESOURCE,
        "quota": QUOTA_NAME,
        "workers": _workers(params),
        "admitted": counts.get("admitted", 0),
        "denied": denied_exceeded + denied_conflicts,
        "denied_exceeded_quota": denied_exceeded,
        "denied_after_retries": denied_conflicts,
        "admission_conflicts": counts.get("conflict", 0),
        "admission_retries": counts.get("retry", 0),
        "create_failures": counts.get("create_failed", 0),
        "stored_pods": counts.get("stored", 0),
        "leaked": leaked,
        "resyncs": len(resyncs),
        "resync_repairs": counts.get("resync", 0),
        "resync_conflicts": counts.get("resync_conflict", 0),
        "used_final": used_final,
        "actual_final": actual_final,
        "most_admitted_usage": most_held,
        "outside_admitted": outside_admitted,
        "outside_released": outside_released,
        "outside_conflicts": counts.get("outside_conflict", 0),
        "outside_writes": sum(counts.get(kind, 0) for kind in _OUTSIDE_WRITES),
        "over_admitted": over_admitted,
        "settled": ends_settled,
        "errors": counts.get("error", 0),
        "seed": seed,
        "invariant_ok": ok,
        "invariant": "; ".join(parts),
        "duration_s": round(elapsed_s, 4),
    }


def _manifest(quota: ResourceQuota) -> dict[str, Any]:
    """The quota as `kubectl get resourcequota <name> -o yaml` shows it (the parts that matter here)."""
    return {
        "name": quota.name,
        "namespace": quota.namespace,
        "resourceVersion": str(quota.resource_version),
        "hard": quantity(quota.hard),
        "used": quantity(quota.used),
    }


def read_state(job_id: int, params: Mapping[str, Any]) -> State:
    """The quota as stored now, and what the pods that exist request: the gap is the leak (or creates under way)."""
    quota = ResourceQuota.objects.filter(job_id=job_id, name=QUOTA_NAME).first()
    if quota is None:
        return State({"quota": None, "actual": None}, {"used": None, "actual": None, "gap": None})
    used, actual = stored(job_id)
    hard = quantity(quota.hard)
    scale = max(hard, used, actual, 1)
    data = {
        "quota": _manifest(quota),
        "actual": actual,
        "pods": actual // max(1, int(params.get("request") or 1)),
        "gap": used - actual,
        "bars": {
            "used": round(100 * used / scale, 1),
            "actual": round(100 * actual / scale, 1),
            "hard": round(100 * hard / scale, 1),
        },
    }
    return State(data, {"used": used, "actual": actual, "gap": used - actual})


_QUOTA_409 = f"409 Conflict: {conflict_message(ResourceQuota, QUOTA_NAME)}"
_OUTSIDE_WRITES = ("outside_charge", "outside_release", "outside_write")
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
    }
    state_keys = ("quota", "actual", "pods", "gap", "bars")
    state_template = "scenarios/quota.html"
    state_title = "The ResourceQuota, and the pods that exist"
    script = "occviz/scenarios/quota.js"
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
        ),
        EventKind(
            "conflict",
            "conflict",
            ("{who}'s quota write for pod-{op} matched 0 rows: conflict (it read v{version_read})",),
            "#d62828",
            "cross",
            explain=_QUOTA_409,
            refused=True,
        ),
        EventKind(
            "retry",
            "retry",
            (f"{{who}} re-reads the quota for pod-{{op}}: retry {{attempt}} of {ADMISSION_RETRIES}",),
            "#f08c00",
            "triangle",
            folds_into="conflict",
            fold=f", retry {{attempt}} of {ADMISSION_RETRIES}",
        ),
        EventKind(
            "denied", "denied (exceeded quota)", ("{who}: {detail.message}",), "#7a1010", "square", explain=_DENIED_403
        ),
        EventKind(
            "retries_exhausted",
            "denied (conflict after retries)",
            (f"{{who}} gave up on pod-{{op}} after {ADMISSION_RETRIES} retries: {{detail.message}}",),
            "#111111",
            "square",
        ),
        EventKind(
            "stored",
            "pod stored",
            ("{who} stored pod-{op}: the pods that exist request {value_written}",),
            "#1c64d6",
            "dot",
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
        ),
        EventKind(
            "resync_conflict",
            "resync conflict",
            ("{who}'s repair matched 0 rows: an admission charged first (it read v{version_read}); it recalculates",),
            "#d62828",
            "cross",
            explain=_QUOTA_409,
            refused=True,
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
        ),
        outside_conflict_kind(_QUOTA_409),
        outside_deleted_kind("the quota", "quota deleted from outside"),
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
    )
    presets = (
        Preset(
            "two-pods-one-gpu",
            "Two pods, one GPU",
            "Two pods ask for the quota's only GPU at once: one is admitted, the other re-reads and is denied.",
            {"pods": 2, "hard": 1, "request": 1, "workers": 2, "think_ms": 20},
        ),
        Preset(
            "hundred-pods-ten-slots",
            "A hundred pods for ten slots",
            "100 pods race for 10 GPUs through 8 admission workers: conflicts and retries, exactly 10 admitted.",
            {"pods": 100, "hard": 10, "request": 1, "workers": 8, "think_ms": 5},
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
        return run(context)

    def read_state(self, job_id: int, params: Mapping[str, Any]) -> State:
        return read_state(job_id, params)

    def actor_names(self, params: Mapping[str, Any]) -> list[str]:
        return [self.actor_name(n) for n in range(1, _workers(params) + CONTROLLER + 1)]

    def actor_name(self, number: int) -> str:
        return "quota-controller" if number == CONTROLLER else f"admission-{number - CONTROLLER}"

    def setup(self, params: Mapping[str, Any]) -> str:
        line = (
            f"{params.get('pods')} pods x {params.get('request')} GPU against hard {params.get('hard')}, "
            f"{min(int(params.get('workers') or 1), int(params.get('pods') or 1))} admission workers"
        )
        if params.get("create_failure_rate"):
            line += f", {params['create_failure_rate']:g} of creates fail"
        line += f", resync every {float(params.get('resync_seconds') or RESYNC_DEFAULT_S):g} s"
        if params.get("seconds"):
            line += f", {params['seconds']:g} s"
        return line


scenario = QuotaRace()
