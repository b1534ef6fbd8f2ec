"""The versioned objects the scenarios contend on.

Every object carries a `resource_version`, as every Kubernetes object carries
`metadata.resourceVersion`. Only `occviz.store.cas.compare_and_swap` changes it:
an existing object is never written with a plain `save()`.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from occviz.store.cas import compare_and_swap

# The namespace of every object's `metadata.uid`: uuid5(this, "<resource>/<primary key>").
_UID_NAMESPACE = uuid.UUID("6f1c5e9a-3b1d-4b8e-9d5f-0c2a7e4b1a11")


class VersionConflict(Exception):
    """A compare-and-swap matched no row: the object changed since it was read."""

    def __init__(self, obj: VersionedObject, expected_version: int | object) -> None:
        self.obj = obj
        self.expected_version = expected_version
        # The object as stored when the write was refused, where the writer looked it up.
        self.stored: VersionedObject | None = None
        super().__init__(conflict_message(type(obj), obj.name))


def conflict_message(model: type[VersionedObject], name: str) -> str:
    """The API server's words for a write on a stale resourceVersion (the body of its 409)."""
    return (
        f'Operation cannot be fulfilled on {model.qualified_resource()} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )


class VersionedObject(models.Model):
    namespace = models.CharField(max_length=63, default="default")
    name = models.CharField(max_length=253)
    resource_version = models.PositiveBigIntegerField(default=1, editable=False)
    job = models.ForeignKey(
        "jobs.Job", null=True, blank=True, on_delete=models.CASCADE, related_name="+", help_text="The job that made it."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    # As the Kubernetes API names it: `kind`, the resource (plural), its group ("" is the core group).
    api_kind = "Object"
    kind_plural = "objects"
    api_group = ""
    api_version = "v1"

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise TypeError(
                f"{type(self).__name__} is versioned: change it with compare_and_swap(), not save(), "
                "so that its resource_version moves and concurrent writers see a conflict."
            )
        super().save(*args, **kwargs)

    @classmethod
    def qualified_resource(cls) -> str:
        """The resource as the API server words it in messages: `leases.coordination.k8s.io`, `pods`."""
        return f"{cls.kind_plural}.{cls.api_group}" if cls.api_group else cls.kind_plural

    @property
    def uid(self) -> str:
        """`metadata.uid`: the same for the object's whole life, different for a new object of the same name."""
        return str(uuid.uuid5(_UID_NAMESPACE, f"{self.kind_plural}/{self.pk}"))

    def compare_and_swap(self, **changes: Any) -> None:
        """Write `changes` if the stored version is still this instance's; raise VersionConflict if not."""
        result = compare_and_swap(type(self), self.pk, self.resource_version, changes)
        if result is None:
            raise VersionConflict(self, self.resource_version)
        for field, value in changes.items():
            setattr(self, field, value)
        self.resource_version = result[0]


class Counter(VersionedObject):
    """One integer row: the hot spot of the counter race."""

    value = models.BigIntegerField(default=0)
    fencing_token = models.BigIntegerField(
        default=0,
        help_text="The newest fencing token a guarded write carried: a write with an older token is rejected.",
    )

    api_kind = "Counter"
    kind_plural = "counters"
    api_group = "occviz.dev"

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "name"], name="counter_unique_name")]


class Pod(VersionedObject):
    """A pod as far as quota admission cares: what it requests, and whether it was created."""

    class Phase(models.TextChoices):
        PENDING = "Pending"
        RUNNING = "Running"
        FAILED = "Failed"

    requests = models.JSONField(default=dict, blank=True, help_text='e.g. {"requests.nvidia.com/gpu": 1}')
    phase = models.CharField(max_length=16, choices=Phase.choices, default=Phase.PENDING)

    api_kind = "Pod"
    kind_plural = "pods"

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "name"], name="pod_unique_name")]


class Lease(VersionedObject):
    """A coordination.k8s.io Lease: the lock that leader election contends for."""

    holder_identity = models.CharField(max_length=253, blank=True)
    lease_duration_seconds = models.PositiveIntegerField(default=15)
    acquire_time = models.DateTimeField(null=True, blank=True)
    renew_time = models.DateTimeField(null=True, blank=True)
    lease_transitions = models.PositiveIntegerField(default=0)

    api_kind = "Lease"
    kind_plural = "leases"
    api_group = "coordination.k8s.io"

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "name"], name="lease_unique_name")]


class ResourceQuota(VersionedObject):
    """A namespace quota: `hard` limits and the `used` amounts admission charges against them."""

    hard = models.JSONField(default=dict, blank=True, help_text='e.g. {"requests.nvidia.com/gpu": 1}')
    used = models.JSONField(default=dict, blank=True)

    api_kind = "ResourceQuota"
    kind_plural = "resourcequotas"

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "name"], name="resourcequota_unique_name")]


class Deployment(VersionedObject):
    """An apps/v1 Deployment as far as its controllers care: fields that different controllers own."""

    replicas = models.IntegerField(default=0, help_text="spec.replicas")
    labels = models.JSONField(default=dict, blank=True, help_text="metadata.labels")
    annotations = models.JSONField(default=dict, blank=True, help_text="metadata.annotations")
    status = models.JSONField(default=dict, blank=True, help_text='e.g. {"observedGeneration": 3}')

    api_kind = "Deployment"
    kind_plural = "deployments"
    api_group = "apps"

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "name"], name="deployment_unique_name")]


class Change(models.Model):
    """One write to a versioned object by the admin or the API, or one refused: the object's history.

    A job's own writes are its events (a change row per write would halve the counter race);
    what a job wrote to an object is read from the job's events, and what the admin and the
    API wrote, or tried to, from here. The watch page shows both, in order.
    """

    class Type(models.TextChoices):
        ADDED = "ADDED"
        MODIFIED = "MODIFIED"
        DELETED = "DELETED"
        CONFLICT = "CONFLICT"  # refused: the writer's version was stale

    class Via(models.TextChoices):
        ADMIN = "admin"
        API = "api"
        JOB = "job"
        STUDENT = "student"

    resource = models.CharField(max_length=32, help_text="The resource, as in the API path: counters, leases...")
    namespace = models.CharField(max_length=63)
    name = models.CharField(max_length=253)
    object_id = models.BigIntegerField()
    type = models.CharField(max_length=16, choices=Type.choices)
    resource_version = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="The version written; for a conflict, the version stored at the time."
    )
    expected_version = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="The version the writer had read; empty for a blind (unconditional) write."
    )
    via = models.CharField(max_length=8, choices=Via.choices)
    writer = models.CharField(max_length=200, help_text='Who wrote: "alice", "alice (token laptop)", "job 12".')
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    object = models.JSONField(
        default=dict, help_text="The object's fields after the write; for a conflict, what the writer sent."
    )
    stored = models.JSONField(
        null=True, blank=True, help_text="For a conflict: the object's fields as stored when it was refused."
    )
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["resource", "object_id", "id"], name="change_object")]

    def __str__(self) -> str:
        return f"{self.type} {self.resource} {self.namespace}/{self.name} v{self.resource_version} by {self.writer}"

    @property
    def blind(self) -> bool:
        return self.type == self.Type.MODIFIED and self.expected_version is None
