"""Admin for jobs and their events (read-only: events are a record, not a form)."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import QuerySet
from django.http import HttpRequest

from occviz.jobs.models import Event, EventBatch, Job, JobShard
from occviz.jobs.registry import programs


class JobShardInline(admin.TabularInline):
    """A job over several processes: its shards, where each ran and how it ended (read-only)."""

    model = JobShard
    extra = 0
    can_delete = False
    fields = (
        "index",
        "runner",
        "first_actor",
        "last_actor",
        "status",
        "error",
        "arrived_at",
        "heartbeat_at",
        "finished_at",
    )
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    inlines = [JobShardInline]
    list_display = ["id", "scenario", "tag", "status", "invariant_ok", "created_by", "created_at", "last_seq"]
    list_filter = ["scenario", "status", "invariant_ok"]
    search_fields = ["=id", "scenario", "created_by__username"]
    readonly_fields = [field.name for field in Job._meta.fields]

    @admin.display(description="tag")
    def tag(self, job: Job) -> str:
        """What its scenario calls it among its own jobs ("occ"), as the job pages' header shows it."""
        found = programs().get(job.scenario)
        return found.tag(job.params) if found else ""


class EventPaginator(Paginator):
    """Counts all events from their batches' ranges: counting the view itself would unnest every batch."""

    object_list: QuerySet[Event]

    @cached_property
    def count(self) -> int:
        if self.object_list.query.where:
            return super().count
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT coalesce(sum(seq_to - seq_from + 1), 0) FROM {EventBatch._meta.db_table}")
            return int(cursor.fetchone()[0])


class EventKindFilter(admin.SimpleListFilter):
    """Every kind of event a program declares (the scenarios' vocabularies), not only those stored so far."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        names = {kind.name for program in programs().values() for kind in program.kinds}
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(kind=self.value()) if self.value() else queryset


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    """Events of every job; ?job=<id> narrows the list to one job (and makes it cheap to count)."""

    list_display = ["job", "seq", "t_ms", "actor", "op", "attempt", "kind", "version_read", "version_written"]
    list_filter = [EventKindFilter]
    list_select_related = ["job"]
    show_full_result_count = False
    paginator = EventPaginator

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        # The id is (job << 32) + seq: look the event up by its job, so only that job's batches are unnested.
        try:
            key = int(object_id)
        except ValueError:
            return None
        return self.get_queryset(request).filter(job_id=key >> 32, seq=key & 0xFFFFFFFF).first()

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # events go with their job

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
