"""A quota race job: its quota, the quota controller and the admission workers, outside writes, its live state.

Pods created and deleted over the HTTP API in the job's namespace go through the same
admission (occviz.store.admission) and contend for the same quota row: their writes to the
quota are followed as events on a lane named after their writer, their pods count as pods
that exist, and their charges and releases count in the admitted usage the verdict checks.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.conf import settings

from occviz.concurrency.latency import Network
from occviz.scenarios.base import State
from occviz.scenarios.network import apply_latency_control, job_network, shard_network
from occviz.scenarios.outside import Payload, outside_write
from occviz.scenarios.quota.actors import (
    CONTROLLER,
    QUOTA_NAME,
    RESOURCE,
    Admission,
    ChargeLedger,
    QuotaController,
    admission_workers,
    quantity,
)
from occviz.scenarios.quota.summary import stored, summarize
from occviz.store.models import ResourceQuota

if TYPE_CHECKING:
    from occviz.jobs.context import Actor, JobContext


def _admission(context: JobContext, quota_id: int, seed: int, network: Network) -> Admission:
    job, params = context.job, context.params
    return Admission(
        job_id=job.pk,
        namespace=f"job-{job.pk}",
        quota_id=quota_id,
        pods=params["pods"],
        request=params["request"],
        think_ms=params["think_ms"],
        failure_rate=params["create_failure_rate"],
        seed=seed,
        recorder=context.recorder,
        stop=context.stop,
        ledger=ChargeLedger(job.pk, quota_id, params["hard"]),
        network=network,
    )


def _actors(context: JobContext, admission: Admission) -> list[Actor]:
    """The quota controller (actor 1), then the admission workers."""
    params = context.params
    controller = QuotaController(admission, params["resync_seconds"], until_repaired=params.get("seconds") is None)
    return [controller.run, *(admission.worker(CONTROLLER + n) for n in range(1, admission_workers(params) + 1))]


def run(context: JobContext) -> dict[str, Any]:
    job, params = context.job, context.params
    namespace = f"job-{job.pk}"
    quota = ResourceQuota.objects.create(
        namespace=namespace, name=QUOTA_NAME, hard={RESOURCE: params["hard"]}, used={RESOURCE: 0}, job=job
    )
    seed = params["seed"] if params.get("seed") is not None else random.randrange(2**32)
    # Each actor's road to the server: direct, or through the job's proxy a latency away (changeable live).
    network = job_network(params, seed)
    context.on_control(lambda action, actor, seconds: apply_latency_control(context, network, action, seconds))
    admission = _admission(context, quota.pk, seed, network)
    admission.make()
    seconds = params.get("seconds")
    lanes = iter(range(admission_workers(params) + CONTROLLER + 1, 2**31))
    context.on_outside_write(
        lambda payload: record_outside_write(context, quota.pk, payload), next_actor=lanes.__next__
    )
    try:
        context.run_actors(
            _actors(context, admission), time_limit_s=float(seconds or settings.OCCVIZ_MAX_SECONDS), plan={"seed": seed}
        )
    finally:
        network.close()
    # The quota locked while the last outside writes are handed over: none lands between them and the summary's.
    with context.settling(
        lambda: list(ResourceQuota.objects.filter(pk=quota.pk).select_for_update().values_list("pk"))
    ):
        context.settle_outside_writes()
    # The admission latency's percentiles, as the live page shows them (a counter's and a controller race's
    # summaries say theirs too): else the summary's latency_ms would be the parameter echoed, which `network` says.
    admission_latency = context.final_figures().get("latency_ms")
    summary = summarize(job.pk, params, admission.ledger, context.elapsed_s, seed)
    return {**summary, "latency_ms": admission_latency, "network": network.describe()}


def shard_actors(context: JobContext, plan: Mapping[str, Any]) -> list[Actor]:
    """In a shard of a job over several processes: the actors again, over the quota and counts the coordinator made."""
    quota_id = ResourceQuota.objects.filter(job_id=context.job.pk, name=QUOTA_NAME).values_list("pk", flat=True).get()
    seed = int(plan["seed"])
    return _actors(context, _admission(context, quota_id, seed, shard_network(context, seed)))


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
