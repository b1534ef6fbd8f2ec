"""Admin for jobs and their events (read-only: events are a record, not a form)."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from occviz.jobs.models import Event, Job


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["id", "scenario", "strategy", "status", "invariant_ok", "created_at", "last_seq"]
    list_filter = ["scenario", "strategy", "status"]
    readonly_fields = [field.name for field in Job._meta.fields]


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ["job", "seq", "t_ms", "actor", "op", "attempt", "kind", "version_read", "version_written"]
    list_filter = ["kind"]
    list_select_related = ["job"]
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
