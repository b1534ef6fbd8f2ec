"""The Kubernetes objects as pydantic models: what a request body may hold, and the OpenAPI schema.

Parsing is strict, as the API server's JSON decoding is: a string where an integer belongs
is a type error (400), not quietly converted. Range rules (a lease lasts more than 0
seconds, nothing is negative) are pydantic constraints too, and come out as 422 Invalid.
Unknown fields are ignored, as the API server does unless asked for strict field validation.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

Int32 = Annotated[int, Field(ge=0, le=INT32_MAX)]
PositiveInt32 = Annotated[int, Field(gt=0, le=INT32_MAX)]
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
NonNegativeInt64 = Annotated[int, Field(ge=0, le=INT64_MAX)]
# A resource.Quantity: "1", "500m", "2Gi", or a plain number.
Quantity = Annotated[int, Field(ge=0, le=INT64_MAX)] | Annotated[str, Field(max_length=64)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class ObjectMeta(_Strict):
    name: str | None = None
    generateName: str | None = None
    namespace: str | None = None
    resourceVersion: str | None = None
    uid: str | None = None
    creationTimestamp: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class _Object(_Strict):
    apiVersion: str | None = None
    kind: str | None = None
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)


class LeaseSpec(_Strict):
    holderIdentity: str | None = None
    leaseDurationSeconds: PositiveInt32 | None = None
    acquireTime: datetime | None = Field(default=None, description="MicroTime: RFC 3339 with microseconds.")
    renewTime: datetime | None = Field(default=None, description="MicroTime: RFC 3339 with microseconds.")
    leaseTransitions: Int32 | None = None


class Lease(_Object):
    """coordination.k8s.io/v1 Lease: the lock leader election contends for."""

    spec: LeaseSpec = Field(default_factory=LeaseSpec)


class ResourceRequirements(_Strict):
    requests: dict[str, Quantity] | None = None
    limits: dict[str, Quantity] | None = None


class Container(_Strict):
    name: str | None = None
    image: str | None = None
    resources: ResourceRequirements | None = None


class PodSpec(_Strict):
    containers: list[Container] = Field(default_factory=list)


class PodStatus(_Strict):
    phase: Literal["Pending", "Running", "Failed"] | None = None


class Pod(_Object):
    """v1 Pod, as far as quota admission cares: its containers' resource requests and its phase."""

    spec: PodSpec = Field(default_factory=PodSpec)
    status: PodStatus | None = None


class ResourceQuotaSpec(_Strict):
    hard: dict[str, Quantity] | None = None


class ResourceQuotaStatus(_Strict):
    hard: dict[str, Quantity] | None = None
    used: dict[str, Quantity] | None = None


class ResourceQuota(_Object):
    """v1 ResourceQuota: `spec.hard` limits, `status.used` what admission charged against them."""

    spec: ResourceQuotaSpec = Field(default_factory=ResourceQuotaSpec)
    status: ResourceQuotaStatus | None = None


class CounterSpec(_Strict):
    value: Int64 | None = None


class CounterStatus(_Strict):
    fencingToken: NonNegativeInt64 | None = Field(
        default=None, description="The newest fencing token a guarded write carried."
    )


class Counter(_Object):
    """occviz.dev/v1 Counter: one integer row, the hot spot of the counter race."""

    spec: CounterSpec = Field(default_factory=CounterSpec)
    status: CounterStatus | None = None


class DeploymentSpec(_Strict):
    replicas: Int32 | None = Field(default=None, description="Desired pods (1 when left out).")


class DeploymentStatus(_Strict):
    observedGeneration: NonNegativeInt64 | None = None
    replicas: Int32 | None = None
    updatedReplicas: Int32 | None = None
    readyReplicas: Int32 | None = None
    availableReplicas: Int32 | None = None
    unavailableReplicas: Int32 | None = None
    collisionCount: Int32 | None = None


class Deployment(_Object):
    """apps/v1 Deployment, as far as its controllers care: labels, annotations, spec.replicas and status."""

    spec: DeploymentSpec = Field(default_factory=DeploymentSpec)
    status: DeploymentStatus | None = None


class Preconditions(_Strict):
    resourceVersion: str | None = None
    uid: str | None = None


class DeleteOptions(_Strict):
    apiVersion: str | None = None
    kind: str | None = None
    preconditions: Preconditions | None = None
    propagationPolicy: str | None = None
    gracePeriodSeconds: int | None = None
    dryRun: list[str] | None = None


class JobSpec(_Strict):
    scenario: str = Field(description="The scenario to run: counter-race, leader-election...")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Its parameters, as the launch form takes them; a missing one takes its default.",
    )


class Job(_Object):
    """occviz.dev/v1 Job: one run of a scenario. Created by launching it; deleted by cancelling it."""

    spec: JobSpec


class StatusDetails(BaseModel):
    name: str | None = None
    group: str | None = None
    kind: str | None = None


class Status(BaseModel):
    """What every error is answered with, as the API server answers it."""

    kind: Literal["Status"] = "Status"
    apiVersion: Literal["v1"] = "v1"
    metadata: dict[str, Any] = Field(default_factory=dict)
    status: str
    message: str
    reason: str
    details: StatusDetails | None = None
    code: int
