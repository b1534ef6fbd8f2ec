"""The versioned objects the scenarios contend on.

Every object carries a `resource_version`, as every Kubernetes object carries
`metadata.resourceVersion`. Only `occviz.store.cas.compare_and_swap` changes it:
an existing object is never written with a plain `save()`.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from occviz.store.cas import compare_and_swap


class VersionConflict(Exception):
    """A compare-and-swap matched no row: the object changed since it was read."""

    def __init__(self, obj: VersionedObject, expected_version: int) -> None:
        self.obj = obj
        self.expected_version = expected_version
        super().__init__(
            f'Operation cannot be fulfilled on {obj.kind_plural} "{obj.name}": the object has been modified; '
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

    kind_plural = "objects"

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

    kind_plural = "counters"

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

    kind_plural = "leases"

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "name"], name="lease_unique_name")]


class ResourceQuota(VersionedObject):
    """A namespace quota: `hard` limits and the `used` amounts admission charges against them."""

    hard = models.JSONField(default=dict, blank=True, help_text='e.g. {"requests.nvidia.com/gpu": 1}')
    used = models.JSONField(default=dict, blank=True)

    kind_plural = "resourcequotas"

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "name"], name="resourcequota_unique_name")]
