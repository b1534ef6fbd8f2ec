"""Each served kind (an entry of store/kinds.py): its request schema, and its Kubernetes JSON both ways.

`to_json(obj)` is the object as the API server would show it; `fields(body, current)` the
store fields a validated body asks for. A replace (PUT) sets the spec as given (what it
leaves out takes its default) and keeps the status it leaves out, as the API server keeps a
status that has its own subresource.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import BaseModel

from occviz.api import quota, schemas
from occviz.store.admission import quantity_text
from occviz.store.kinds import ObjectKind, kind_of
from occviz.store.models import Counter, Deployment, Lease, Pod, ResourceQuota, VersionedObject
from occviz.store.writes import Writer

DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUFFIXES = {
    "m": Decimal("0.001"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
}
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?")


def subdomain_error(name: str) -> str | None:
    """Why `name` is not a valid object name (a lowercase RFC 1123 subdomain), or None."""
    if len(name) > 253:
        return "must be no more than 253 characters"
    if not DNS_SUBDOMAIN.fullmatch(name):
        return (
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
            f"validation is '{DNS_SUBDOMAIN.pattern}')"
        )
    return None


def label_error(namespace: str) -> str | None:
    """Why `namespace` is not a valid namespace name (a lowercase RFC 1123 label), or None."""
    if len(namespace) > 63 or not DNS_LABEL.fullmatch(namespace):
        return (
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
            "start and end with an alphanumeric character (e.g. 'my-name', regex used for validation is "
            f"'{DNS_LABEL.pattern}'), at most 63 characters"
        )
    return None


def microtime(value: datetime | None) -> str | None:
    """A MicroTime as the API server writes it: RFC 3339 in UTC with six fractional digits."""
    if value is None:
        return None
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339(value: datetime) -> str:
    """A metav1.Time: RFC 3339 in UTC, whole seconds."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FieldInvalid(Exception):
    """A value that parses but is not allowed: `field` (its JSON path), `value`, `why`."""

    def __init__(self, field: str, value: Any, why: str) -> None:
        super().__init__(f"{field}: Invalid value: {value!r}: {why}")
        self.field = field
        self.value = value
        self.why = why


def quantity(value: int | str, field: str) -> int | float:
    """A resource.Quantity ("1", "500m", "2Gi", 3) as a number; FieldInvalid if it is none."""
    if isinstance(value, int):
        return value
    match = _QUANTITY.fullmatch(value.strip())
    if match is None:
        raise FieldInvalid(
            field,
            value,
            "a quantity is a non-negative number with an optional suffix (m, k, M, G, T, Ki, Mi, Gi, Ti): 1, 500m, 2Gi",
        )
    try:
        amount = Decimal(match.group(1)) * _SUFFIXES[match.group(2) or ""]
    except InvalidOperation:
        raise FieldInvalid(field, value, "not a quantity") from None
    if amount > schemas.INT64_MAX:
        raise FieldInvalid(field, value, "too large")
    return int(amount) if amount == amount.to_integral_value() else float(amount)


def _quantities(values: dict[str, Any] | None, field: str) -> dict[str, int | float]:
    return {key: quantity(amount, f"{field}[{key}]") for key, amount in (values or {}).items()}


def _texts(values: dict[str, Any] | None) -> dict[str, str]:
    return {key: quantity_text(amount) for key, amount in (values or {}).items()}


# -- each kind's JSON ------------------------------------------------------------------


def _lease_json(obj: Lease) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if obj.holder_identity:
        spec["holderIdentity"] = obj.holder_identity
    spec["leaseDurationSeconds"] = obj.lease_duration_seconds
    if obj.acquire_time is not None:
        spec["acquireTime"] = microtime(obj.acquire_time)
    if obj.renew_time is not None:
        spec["renewTime"] = microtime(obj.renew_time)
    spec["leaseTransitions"] = obj.lease_transitions
    return {"spec": spec}


def _lease_fields(body: schemas.Lease, current: Lease | None) -> dict[str, Any]:
    spec = body.spec
    return {
        "holder_identity": spec.holderIdentity or "",
        "lease_duration_seconds": spec.leaseDurationSeconds or 15,
        "acquire_time": spec.acquireTime,
        "renew_time": spec.renewTime,
        "lease_transitions": spec.leaseTransitions or 0,
    }


# Pod requests are stored under quota names (`requests.nvidia.com/gpu`), as admission charges them.
_REQUESTS_PREFIX = "requests."


def _pod_json(obj: Pod) -> dict[str, Any]:
    requests = {
        key.removeprefix(_REQUESTS_PREFIX): quantity_text(amount) for key, amount in (obj.requests or {}).items()
    }
    container: dict[str, Any] = {"name": "main", "image": "occviz/pod"}
    if requests:
        container["resources"] = {"requests": requests}
    return {"spec": {"containers": [container]}, "status": {"phase": obj.phase}}


def _pod_fields(body: schemas.Pod, current: Pod | None) -> dict[str, Any]:
    requests: dict[str, int | float] = {}
    for index, container in enumerate(body.spec.containers):
        asked = container.resources.requests if container.resources else None
        field = f"spec.containers[{index}].resources.requests"
        for key, amount in _quantities(asked, field).items():
            quota_key = key if key.startswith(_REQUESTS_PREFIX) else _REQUESTS_PREFIX + key
            requests[quota_key] = requests.get(quota_key, 0) + amount
    if current is not None and requests != (current.requests or {}):
        # The quota charged the requests at the create: an update may not change them (as the API server says).
        raise FieldInvalid(
            "spec.containers[0].resources.requests",
            _texts(requests),
            "pod updates may not change resource requests: the quota charged them when the pod was created",
        )
    phase = body.status.phase if body.status and body.status.phase else None
    return {
        "requests": requests,
        "phase": phase or (current.phase if current else Pod.Phase.PENDING),
    }


def _quota_json(obj: ResourceQuota) -> dict[str, Any]:
    hard = _texts(obj.hard)
    return {"spec": {"hard": hard}, "status": {"hard": hard, "used": _texts(obj.used)}}


def _quota_fields(body: schemas.ResourceQuota, current: ResourceQuota | None) -> dict[str, Any]:
    fields: dict[str, Any] = {"hard": _quantities(body.spec.hard, "spec.hard")}
    if body.status and body.status.used is not None:
        fields["used"] = _quantities(body.status.used, "status.used")
    elif current is None:
        fields["used"] = {key: 0 for key in fields["hard"]}
    return fields


def _counter_json(obj: Counter) -> dict[str, Any]:
    return {"spec": {"value": obj.value}, "status": {"fencingToken": obj.fencing_token}}


def _counter_fields(body: schemas.Counter, current: Counter | None) -> dict[str, Any]:
    fields: dict[str, Any] = {"value": body.spec.value or 0}
    if body.status and body.status.fencingToken is not None:
        fields["fencing_token"] = body.status.fencingToken
    return fields


def _deployment_json(obj: Deployment) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    if obj.labels:
        metadata["labels"] = {key: str(value) for key, value in obj.labels.items()}
    if obj.annotations:
        metadata["annotations"] = {key: str(value) for key, value in obj.annotations.items()}
    return {"metadata": metadata, "spec": {"replicas": obj.replicas}, "status": dict(obj.status or {})}


def _deployment_fields(body: schemas.Deployment, current: Deployment | None) -> dict[str, Any]:
    meta = body.metadata
    fields: dict[str, Any] = {
        "labels": dict(meta.labels or {}),
        "annotations": dict(meta.annotations or {}),
        "replicas": body.spec.replicas if body.spec.replicas is not None else 1,
    }
    if body.status is not None:
        fields["status"] = body.status.model_dump(exclude_none=True)
    return fields


def _no_admission(namespace: str, name: str, fields: Mapping[str, Any], writer: Writer) -> AbstractContextManager[None]:
    return nullcontext()


def _no_release(obj: Any, writer: Writer) -> AbstractContextManager[None]:
    return nullcontext()


@dataclass(frozen=True)
class Kind:
    """One served kind (an entry of store/kinds.py): its request schema, and its JSON both ways."""

    object_kind: ObjectKind
    schema: type[schemas._Object]
    _to_json: Callable[[Any], dict[str, Any]]
    _fields: Callable[[Any, Any], dict[str, Any]]
    admitted: Callable[[str, str, Mapping[str, Any], Writer], AbstractContextManager[None]] = _no_admission
    """admitted(namespace, name, fields, writer): around a create's write, its admission (an ApiError refuses it)."""
    released: Callable[[Any, Writer], AbstractContextManager[None]] = _no_release
    """released(object, writer): around a delete's write, what the object held is given back after it."""
    columns: tuple[tuple[str, str], ...] = ()
    """What `kubectl get` prints between NAME and AGE, as a cluster's does: (column, path in the JSON)."""

    @property
    def model(self) -> type[VersionedObject]:
        return self.object_kind.model

    @property
    def short_names(self) -> tuple[str, ...]:
        return self.object_kind.short_names

    @property
    def kind(self) -> str:
        return self.object_kind.kind

    @property
    def plural(self) -> str:
        return self.object_kind.plural

    @property
    def group(self) -> str:
        return self.object_kind.group

    @property
    def api_version(self) -> str:
        return self.object_kind.api_version

    @property
    def path(self) -> str:
        return self.object_kind.path

    def to_json(self, obj: VersionedObject) -> dict[str, Any]:
        """The object as the API server shows it; a kind's own metadata (labels, annotations) follows the common."""
        own = self._to_json(obj)
        metadata = {
            "name": obj.name,
            "namespace": obj.namespace,
            "uid": obj.uid,
            "resourceVersion": str(obj.resource_version),
            "creationTimestamp": rfc3339(obj.created_at),
            **own.pop("metadata", {}),
        }
        return {"apiVersion": self.api_version, "kind": self.kind, "metadata": metadata, **own}

    def fields(self, body: BaseModel, current: VersionedObject | None) -> dict[str, Any]:
        """The store fields `body` asks for (FieldInvalid for a value that is not allowed)."""
        return self._fields(body, current)


# Every kind of store/kinds.py, in its order (tests/test_watch_page.py checks it).
KINDS: tuple[Kind, ...] = (
    Kind(
        kind_of(Pod),
        schemas.Pod,
        _pod_json,
        _pod_fields,
        admitted=quota.admitted,
        released=quota.released,
        columns=(("Status", "status.phase"),),
    ),
    Kind(kind_of(ResourceQuota), schemas.ResourceQuota, _quota_json, _quota_fields),
    Kind(
        kind_of(Deployment),
        schemas.Deployment,
        _deployment_json,
        _deployment_fields,
        columns=(("Replicas", "spec.replicas"),),
    ),
    Kind(kind_of(Lease), schemas.Lease, _lease_json, _lease_fields, columns=(("Holder", "spec.holderIdentity"),)),
    Kind(kind_of(Counter), schemas.Counter, _counter_json, _counter_fields, columns=(("Value", "spec.value"),)),
)
