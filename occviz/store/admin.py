"""Admin for the versioned objects. Edits go through compare_and_swap like every other write."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest

from occviz.store.models import Counter, Lease, Pod, ResourceQuota, VersionConflict, VersionedObject


class VersionedAdmin(admin.ModelAdmin):
    readonly_fields = ["resource_version", "job", "created_at"]
    list_filter = ["namespace"]
    search_fields = ["namespace", "name"]

    def save_model(self, request: HttpRequest, obj: VersionedObject, form: Any, change: bool) -> None:
        if not change:
            super().save_model(request, obj, form, change)
            return
        changes = {name: form.cleaned_data[name] for name in form.changed_data}
        try:
            obj.compare_and_swap(**changes)
        except VersionConflict as conflict:
            messages.error(request, str(conflict))


@admin.register(Counter)
class CounterAdmin(VersionedAdmin):
    list_display = ["name", "namespace", "value", "resource_version", "job"]
    # A guarded counter's fencing token moves only with a leader's guarded write.
    readonly_fields = [*VersionedAdmin.readonly_fields, "fencing_token"]


@admin.register(Pod)
class PodAdmin(VersionedAdmin):
    list_display = ["name", "namespace", "phase", "requests", "resource_version"]


@admin.register(Lease)
class LeaseAdmin(VersionedAdmin):
    list_display = ["name", "namespace", "holder_identity", "lease_transitions", "renew_time", "resource_version"]


@admin.register(ResourceQuota)
class ResourceQuotaAdmin(VersionedAdmin):
    list_display = ["name", "namespace", "hard", "used", "resource_version"]
