"""Admin for the versioned objects and their history.

Each kind's admin is a `VersionedAdmin` (versioned_admin.py: every write carries the version
its editor loaded, a stale one is a conflict). Its actions call the domain's own functions:
a Lease is released as a replica's ReleaseOnCancel writes it, a quota's usage recalculated
as the quota controller's resync counts it.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from occviz.store import admission, leases
from occviz.store.models import Change, Counter, Deployment, Lease, Pod, ResourceQuota
from occviz.store.versioned_admin import VersionedAdmin, update_action


@admin.register(Counter)
class CounterAdmin(VersionedAdmin):
    list_display = ["name", "namespace", "value", "version", "job"]
    list_editable = ["value"]
    # A guarded counter's fencing token moves only with a leader's guarded write.
    readonly_fields = [*VersionedAdmin.readonly_fields, "fencing_token"]
    actions = [*VersionedAdmin.actions, "reset"]

    @admin.action(description="Reset selected counters to 0")
    def reset(self, request: HttpRequest, queryset: QuerySet[Counter]) -> None:
        self.write_rows(request, queryset, "Reset", update_action(lambda counter: {"value": 0}))


@admin.register(Pod)
class PodAdmin(VersionedAdmin):
    list_display = ["name", "namespace", "phase", "requests", "version", "job"]
    list_filter = [*VersionedAdmin.list_filter, "phase"]


@admin.register(Lease)
class LeaseAdmin(VersionedAdmin):
    list_display = ["name", "namespace", "holder_identity", "lease_transitions", "renew_time", "version", "job"]
    list_editable = ["holder_identity"]
    search_fields = [*VersionedAdmin.search_fields, "holder_identity"]
    actions = [*VersionedAdmin.actions, "release"]

    @admin.action(description="Release selected leases (no holder, as ReleaseOnCancel)")
    def release(self, request: HttpRequest, queryset: QuerySet[Lease]) -> None:
        self.write_rows(
            request,
            queryset,
            "Released",
            update_action(lambda lease: leases.released(lease.lease_transitions, timezone.now())),
        )


@admin.register(ResourceQuota)
class ResourceQuotaAdmin(VersionedAdmin):
    list_display = ["name", "namespace", "hard", "used", "version", "job"]
    actions = [*VersionedAdmin.actions, "recalculate"]

    @admin.action(description="Recalculate the usage of selected quotas now")
    def recalculate(self, request: HttpRequest, queryset: QuerySet[ResourceQuota]) -> None:
        self.write_rows(
            request,
            queryset,
            "Recalculated",
            update_action(lambda quota: {"used": admission.recount(quota.namespace, quota.hard)}),
        )


class ReadOnlyAdmin(admin.ModelAdmin):
    """A record: listed and viewed, never added or edited here."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Change)
class ChangeAdmin(ReadOnlyAdmin):
    """The admin's and the API's writes to the versioned objects, and their refusals."""

    list_display = [
        "id",
        "at",
        "type",
        "resource",
        "namespace",
        "name",
        "resource_version",
        "expected_version",
        "blind",
        "via",
        "writer",
    ]
    list_filter = ["type", "via", "resource"]
    search_fields = ["namespace", "name", "writer"]

    @admin.display(boolean=True, description="blind")
    def blind(self, change: Change) -> bool:
        return change.blind

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # the history is what happened


@admin.register(Deployment)
class DeploymentAdmin(VersionedAdmin):
    list_display = ["name", "namespace", "replicas", "labels", "version", "job"]
