"""Quota admission of the pods created over the API, and the release of a deleted pod's charge.

A pod's create is charged to every ResourceQuota of its namespace whose `hard` names a
resource it requests, by occviz.store.admission (the quota race's admission workers run the
same), each quota's write through occviz.store.writes: a Change by the API's caller, and an
outside write of the job that owns the quota, if one runs. A pod one quota has no room for
is 403 Forbidden with the API server's message, and the charges already made are given
back; so are they if the pod's own write fails. A deleted pod's charge is released, as the
quota controller's replenishment does at once in Kubernetes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from occviz.api.status import ApiError, resource_details
from occviz.store import admission, writes
from occviz.store.admission import Amounts, QuotaUsage, Read, Write
from occviz.store.models import Pod, ResourceQuota, VersionConflict


def _quotas(namespace: str, requested: Amounts) -> list[ResourceQuota]:
    quotas = ResourceQuota.objects.filter(namespace=namespace).order_by("name")
    return [quota for quota in quotas if admission.limited(requested, quota.hard or {})]


def _read(quota: ResourceQuota) -> Read:
    def read(attempt: int) -> QuotaUsage:
        stored = ResourceQuota.objects.filter(pk=quota.pk).first()
        # A quota deleted meanwhile limits nothing any more.
        return admission.usage_of(stored) if stored is not None else QuotaUsage(quota.name, {}, {}, 0)

    return read


def _write(quota: ResourceQuota, writer: writes.Writer) -> Write:
    def write(attempt: int, usage: QuotaUsage, used: dict[str, int | float]) -> int | None:
        try:
            return writes.update(quota, {"used": used}, writer, expected_version=usage.version).resource_version
        except (VersionConflict, ResourceQuota.DoesNotExist):
            return None

    return write


def _release(quotas: list[ResourceQuota], requested: Amounts, writer: writes.Writer) -> None:
    for quota in quotas:
        # Past its attempts a release is left to a recalculation of the quota (the admin's, a job's resync).
        admission.release(requested, _read(quota), _write(quota, writer))


def _refused(outcome: admission.Denied | admission.RetriesExhausted, pod: str, quota: str) -> ApiError:
    if isinstance(outcome, admission.Denied):
        return ApiError(403, outcome.message, details={"name": pod, "kind": Pod.kind_plural})
    return ApiError(
        409, outcome.message, details=resource_details(quota, ResourceQuota.api_group, ResourceQuota.kind_plural)
    )


@contextmanager
def admitted(namespace: str, name: str, fields: Mapping[str, Any], writer: writes.Writer) -> Iterator[None]:
    """Charge the pod's requests to its namespace's quotas; inside, store it. 403/409 (ApiError) if refused."""
    requested: Amounts = fields.get("requests") or {}
    quotas = _quotas(namespace, requested)
    if not quotas:
        yield
        return
    with admission.in_flight([quota.pk for quota in quotas]):
        charged: list[ResourceQuota] = []
        try:
            for quota in quotas:
                outcome = admission.charge(name, requested, _read(quota), _write(quota, writer))
                if not isinstance(outcome, admission.Admitted):
                    raise _refused(outcome, name, quota.name)
                charged.append(quota)
            yield
        except BaseException:
            _release(charged, requested, writer)
            raise


@contextmanager
def released(pod: Pod, writer: writes.Writer) -> Iterator[None]:
    """Inside, delete the pod; then release its charge on its namespace's quotas."""
    requested: Amounts = pod.requests or {}
    quotas = _quotas(pod.namespace, requested)
    if not quotas:
        yield
        return
    with admission.in_flight([quota.pk for quota in quotas]):
        yield
        _release(quotas, requested, writer)
