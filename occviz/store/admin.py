"""Admin for the versioned objects and their history: no write without the version read.

Every page that can write carries what the editor loaded, signed (`Loaded`): the change
form in a hidden field, the change list as a hidden input per row, the delete page in its
form. A write goes through `store.writes` with that version as the expected one, so a
second editor, a job or the API having written meanwhile makes it a conflict, never a
silent overwrite; a missing or altered version is refused outright. A refused change form
answers 409 with the three-way conflict page (what the editor saw, what they entered,
what is stored and who wrote it since), from which they re-apply their changes onto the
current version or discard them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.options import ActionLocation
from django.contrib.admin.utils import unquote
from django.core import signing
from django.core.exceptions import ValidationError
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from occviz.store import writes
from occviz.store.merge import MINE, FieldMerge, as_json, merged_changes, three_way
from occviz.store.models import (
    Change,
    Counter,
    Deployment,
    Lease,
    Pod,
    ResourceQuota,
    VersionConflict,
    VersionedObject,
)
from occviz.store.writes import AlreadyExists, Writer

_SALT = "occviz.store.admin.loaded"
_MINE_SALT = "occviz.store.admin.mine"
LOADED = "loaded"  # the change form's and the delete page's field
ROW_LOADED = "_loaded"  # the change list's hidden input, one per row
REFUSED_MISSING = (
    "This page did not carry a valid version of the object (it is missing or was altered), so nothing was "
    "written. Reload the page to edit the current version."
)


def admin_writer(request: HttpRequest) -> Writer:
    return Writer("admin", request.user.get_username(), request.user)


@dataclass(frozen=True)
class Loaded:
    """What an editor's page showed: one object at one version, and its fields (JSON) at that version."""

    model: str
    pk: int
    version: int
    values: dict[str, Any]

    @classmethod
    def of(cls, obj: VersionedObject) -> Loaded:
        return cls(obj._meta.label_lower, obj.pk, obj.resource_version, writes.fields_of(obj))

    def sign(self) -> str:
        payload = {"m": self.model, "pk": self.pk, "v": self.version, "values": self.values}
        return signing.dumps(payload, salt=_SALT, compress=True)

    @classmethod
    def read(cls, token: object, model: type[Model], pk: object = None) -> Loaded | None:
        """The Loaded a page sent back, if its signature holds and it is of `model` (and `pk`); else None."""
        if not isinstance(token, str):
            return None
        try:
            data = signing.loads(token, salt=_SALT)
        except signing.BadSignature:
            return None
        loaded = cls(data["m"], data["pk"], data["v"], data["values"])
        if loaded.model != model._meta.label_lower or (pk is not None and loaded.pk != pk):
            return None
        return loaded


def python_value(model: type[Model], name: str, value: Any) -> Any:
    """A field's JSON value (as `Loaded` keeps it) as the model field takes it."""
    return model._meta.get_field(name).to_python(value)  # type: ignore[union-attr]


@dataclass
class RowVersions:
    """The versions a change list page was loaded at (by primary key), and the rows refused as stale."""

    loaded: dict[int, Loaded]
    stale: list[int] = field(default_factory=list)

    _ATTR: ClassVar[str] = "_occviz_row_versions"

    @classmethod
    def of(cls, request: HttpRequest, model: type[Model]) -> RowVersions:
        """The request's rows, read once per request so every form of the list shares them."""
        rows = getattr(request, cls._ATTR, None)
        if rows is None:
            tokens = (Loaded.read(token, model) for token in request.POST.getlist(ROW_LOADED))
            rows = cls({loaded.pk: loaded for loaded in tokens if loaded is not None})
            setattr(request, cls._ATTR, rows)
        return rows


class VersionedForm(forms.ModelForm):
    """A change form that carries the version and values the editor loaded, and judges their changes by them.

    On a change list (`rows` set) the loaded version comes from the row's hidden input instead, and a
    changed row loaded at an older version than stored is refused at validation.
    """

    loaded = forms.CharField(widget=forms.HiddenInput, required=False)
    rows: ClassVar[RowVersions | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.base: Loaded | None = None
        if self.instance.pk is None or self.rows is not None:
            del self.fields[LOADED]  # nothing loaded yet, or loaded per row
        if self.instance.pk is None:
            return
        if not self.is_bound:
            self.initial[LOADED] = Loaded.of(self.instance).sign()
            return
        if self.rows is not None:
            self.base = self.rows.loaded.get(self.instance.pk)
        else:
            self.base = Loaded.read(self.data.get(self.add_prefix(LOADED)), type(self.instance), self.instance.pk)
        if self.base is not None:
            # What the editor changed is judged against what they saw, not against what is stored now.
            model = type(self.instance)
            for name in self.fields:
                if name in self.base.values:
                    self.initial[name] = python_value(model, name, self.base.values[name])

    def mine(self) -> dict[str, Any]:
        """The fields the editor changed from what they loaded, as JSON."""
        return {name: as_json(self.cleaned_data[name]) for name in self.changed_data if name != LOADED}

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        if self.instance.pk is None or (self.rows is not None and not self.has_changed()):
            return cleaned
        if self.base is None:
            raise ValidationError(REFUSED_MISSING, code="version")
        if self.rows is not None and self.base.version != self.instance.resource_version:
            self.rows.stale.append(self.instance.pk)
            raise ValidationError(self._stale_message(), code="conflict")
        return cleaned

    def _stale_message(self) -> str:
        assert self.base is not None
        stored = self.instance
        now = ", ".join(f"{name} = {getattr(stored, name)!r}" for name in self.fields if name != LOADED)
        writers = "; ".join(entry["who"] for entry in writers_since(stored, self.base.version))
        return (
            f"{stored} changed since this page was loaded: you saw version {self.base.version}, it is now version "
            f"{stored.resource_version} ({writers}); stored now: {now}. Nothing was written to it; save again to "
            f"put your entry onto version {stored.resource_version}."
        )


def writers_since(obj: VersionedObject, version: int) -> list[dict[str, Any]]:
    """Who wrote `obj` after `version`: the admin's and the API's writes from its history, then its job's."""
    changes = list(
        Change.objects.filter(
            resource=obj.kind_plural,
            object_id=obj.pk,
            resource_version__gt=version,
            type__in=[Change.Type.ADDED, Change.Type.MODIFIED],
        ).order_by("id")
    )
    entries = [
        {
            "version": change.resource_version,
            "who": f"{change.via} {change.writer}" + (" (blind write)" if change.blind else ""),
            "at": change.at,
        }
        for change in changes
    ]
    # A job's own writes are its events, not Changes: the versions the history does not explain are its.
    unexplained = obj.resource_version - version - len(changes)
    if unexplained > 0:
        who = f"job {obj.job_id}" if obj.job_id else "a writer outside the admin and the API"
        entries.append({"version": None, "who": f"{who} ({unexplained} version{'s'[: unexplained - 1]})", "at": None})
    return entries


class RowConflict(Exception):
    """A change list row passed validation but was written by someone else before it was saved."""


# What save_model did, for the log and the response that follow it in Django's flow.
_OUTCOME = "_occviz_outcome"
_WRITTEN = "written"
_UNCHANGED = "unchanged"


@dataclass(frozen=True)
class Conflict:
    stored: VersionedObject
    base: Loaded
    mine: dict[str, Any]
    message: str


class VersionedAdmin(admin.ModelAdmin):
    form = VersionedForm
    readonly_fields = ["resource_version", "job", "created_at"]
    list_filter = ["namespace"]
    search_fields = ["namespace", "name"]
    delete_confirmation_template = "admin/store/delete_confirmation.html"
    conflict_template = "admin/store/conflict.html"
    actions = ["delete_unchanged"]

    # --- what the pages carry

    @admin.display(description="version", ordering="resource_version")
    def version(self, obj: VersionedObject) -> str:
        """The row's version, and (hidden) what this page loaded, for list_editable and the actions."""
        return format_html(
            '{}<input type="hidden" name="{}" value="{}">', obj.resource_version, ROW_LOADED, Loaded.of(obj).sign()
        )

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_fields(request, obj))
        if obj is not None and self.has_change_permission(request, obj):
            return fields
        return [name for name in fields if name != LOADED]  # nothing to write back: nothing to carry

    def get_changelist_form(self, request: HttpRequest, **kwargs: Any) -> Any:
        form = type("VersionedRowForm", (VersionedForm,), {"rows": RowVersions.of(request, self.model)})
        return super().get_changelist_form(request, form=form, **kwargs)

    def get_actions(self, request: HttpRequest, action_location: Any = ActionLocation.CHANGE_LIST) -> Any:
        actions = super().get_actions(request, action_location=action_location)
        actions.pop("delete_selected", None)  # it deletes whatever is stored: delete_unchanged checks versions
        return actions

    # --- the change form

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        writer = admin_writer(request)
        if not change:
            fields = {name: form.cleaned_data[name] for name in form.fields if name != LOADED}
            try:
                created = writes.create(self.model, fields, writer)
            except AlreadyExists as taken:
                # Another writer took the name after the form checked it was free.
                setattr(request, _OUTCOME, taken)
                return
            _copy_fields(created, obj)
            obj._state.adding = False
            setattr(request, _OUTCOME, _WRITTEN)
            return
        mine = form.mine()
        if not mine:
            setattr(request, _OUTCOME, _UNCHANGED)
            return
        try:
            written = writes.update(obj, _python(self.model, mine), writer, expected_version=form.base.version)
        except VersionConflict as conflict:
            if form.rows is not None:
                raise RowConflict(str(conflict)) from conflict
            assert conflict.stored is not None
            setattr(request, _OUTCOME, Conflict(conflict.stored, form.base, mine, str(conflict)))
            return
        _copy_fields(written, obj)
        setattr(request, _OUTCOME, _WRITTEN)

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        if getattr(request, _OUTCOME, None) == _WRITTEN:
            return super().log_change(request, obj, message)
        return None

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        if getattr(request, _OUTCOME, None) == _WRITTEN:
            return super().log_addition(request, obj, message)
        return None

    def response_add(self, request: HttpRequest, obj: Any, post_url_continue: str | None = None) -> HttpResponse:
        outcome = getattr(request, _OUTCOME, None)
        if isinstance(outcome, AlreadyExists):
            self.message_user(request, f"{outcome}: nothing was written.", messages.ERROR)
            return HttpResponseRedirect(request.path)
        return super().response_add(request, obj, post_url_continue)

    def response_change(self, request: HttpRequest, obj: Any) -> HttpResponse:
        outcome = getattr(request, _OUTCOME, None)
        if isinstance(outcome, Conflict):
            return self.conflict_response(request, outcome)
        if outcome == _UNCHANGED:
            self.message_user(request, f"No field of {obj} was changed: nothing was written.", messages.INFO)
            return HttpResponseRedirect(request.path)
        return super().response_change(request, obj)

    def changeform_view(
        self, request: HttpRequest, object_id: str | None = None, form_url: str = "", extra_context: Any = None
    ) -> Any:
        if request.method == "POST" and object_id is not None and "_reapply" in request.POST:
            return self.reapply_view(request, object_id)
        return super().changeform_view(request, object_id, form_url, extra_context)

    # --- the conflict page and re-applying from it

    def conflict_response(
        self, request: HttpRequest, conflict: Conflict, *, deleting: bool = False
    ) -> TemplateResponse:
        stored = conflict.stored
        merges = three_way(conflict.base.values, conflict.mine, writes.fields_of(stored))
        opts = self.model._meta
        context = {
            **self.admin_site.each_context(request),
            "title": f"Conflict: {opts.verbose_name} {stored} changed since you loaded it",
            "opts": opts,
            "original": stored,
            "deleting": deleting,
            "message": conflict.message,
            "base": conflict.base,
            "rows": [_row(self.model, merge) for merge in merges],
            "clashes": any(merge.clash for merge in merges),
            "applies": any(merge.goes_through or merge.clash for merge in merges),
            "writers": writers_since(stored, conflict.base.version),
            "loaded_now": Loaded.of(stored).sign(),
            "base_token": conflict.base.sign(),
            "mine_token": signing.dumps(conflict.mine, salt=_MINE_SALT, compress=True),
            "change_url": reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[stored.pk]),
            "delete_url": reverse(f"admin:{opts.app_label}_{opts.model_name}_delete", args=[stored.pk]),
        }
        return TemplateResponse(request, self.conflict_template, context, status=409)

    def reapply_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Write the editor's changes, merged three ways, onto the version the conflict page showed."""
        obj = self.get_object(request, unquote(object_id))
        if obj is None or not self.has_change_permission(request, obj):
            return super().changeform_view(request, object_id)  # Django's answer: gone, or not allowed
        now = Loaded.read(request.POST.get(LOADED), self.model, obj.pk)
        base = Loaded.read(request.POST.get("_base"), self.model, obj.pk)
        try:
            mine = signing.loads(request.POST.get("_mine", ""), salt=_MINE_SALT)
        except signing.BadSignature:
            mine = None
        editable = set(self.get_form(request, obj, change=True).base_fields) - {LOADED}
        if now is None or base is None or not isinstance(mine, dict) or not set(mine) <= editable:
            self.message_user(request, REFUSED_MISSING, messages.ERROR)
            return HttpResponseRedirect(request.path)
        merges = three_way(base.values, mine, now.values)
        changes = merged_changes(merges, {merge.name: request.POST.get(f"choice_{merge.name}", "") for merge in merges})
        if not changes:
            self.message_user(request, f"Nothing of yours to apply: {obj} is kept as stored.", messages.INFO)
            return HttpResponseRedirect(request.path)
        try:
            written = writes.update(
                obj, _python(self.model, changes), admin_writer(request), expected_version=now.version
            )
        except VersionConflict as conflict:
            assert conflict.stored is not None
            return self.conflict_response(request, Conflict(conflict.stored, now, changes, str(conflict)))
        super().log_change(request, written, [{"changed": {"fields": sorted(changes)}}])
        self.message_user(
            request,
            f"Your changes ({', '.join(sorted(changes))}) were applied to {written}: "
            f"version {written.resource_version}.",
            messages.SUCCESS,
        )
        return HttpResponseRedirect(request.path)

    # --- the change list's list_editable

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        try:
            response = super().changelist_view(request, extra_context)
        except RowConflict as conflict:
            # Written meanwhile, between validation and the write: the whole save was rolled back.
            self.message_user(request, f"Nothing was saved: {conflict}", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())
        if RowVersions.of(request, self.model).stale:
            response.status_code = 409
        return response

    # --- deleting at the version shown

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> Any:
        obj = self.get_object(request, unquote(object_id))
        if obj is None or not self.has_delete_permission(request, obj):
            return super().delete_view(request, object_id, extra_context)  # Django's answer: gone, or not allowed
        if request.method != "POST":
            return super().delete_view(request, object_id, {**(extra_context or {}), LOADED: Loaded.of(obj).sign()})
        base = Loaded.read(request.POST.get(LOADED), self.model, obj.pk)
        if base is None:
            self.message_user(request, REFUSED_MISSING, messages.ERROR)
            return HttpResponseRedirect(request.path)
        try:
            writes.delete(obj, admin_writer(request), expected_version=base.version)
        except VersionConflict as conflict:
            assert conflict.stored is not None
            return self.conflict_response(request, Conflict(conflict.stored, base, {}, str(conflict)), deleting=True)
        self.log_deletions(request, [obj])  # type: ignore[arg-type]  # as Django's own delete view does
        return self.response_delete(request, str(obj), obj.pk)

    # --- actions on the rows as loaded

    def write_rows(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        done: str,
        write: Callable[[Any, Writer, int], object],
    ) -> None:
        """Run `write(obj, writer, loaded_version)` on each selected row; refuse the rows that changed since loaded."""
        rows = RowVersions.of(request, self.model)
        writer = admin_writer(request)
        written, refused = 0, []
        for obj in queryset.order_by("pk"):
            loaded = rows.loaded.get(obj.pk)
            if loaded is None:
                refused.append(f"{obj} (no valid version on the page)")
                continue
            try:
                write(obj, writer, loaded.version)
            except VersionConflict as conflict:
                now = conflict.stored.resource_version if conflict.stored is not None else "?"
                refused.append(f"{obj} (loaded at version {loaded.version}, now {now})")
            else:
                written += 1
        names = self.model._meta.verbose_name if written == 1 else self.model._meta.verbose_name_plural
        if written:
            self.message_user(request, f"{done} {written} {names}.", messages.SUCCESS)
        if refused:
            self.message_user(
                request,
                f"Refused {len(refused)}, changed since this page was loaded (nothing written to them): "
                f"{', '.join(refused)}. Reload the page to see them as stored.",
                messages.ERROR,
            )

    @admin.action(description="Delete selected %(verbose_name_plural)s unless changed since loaded")
    def delete_unchanged(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self.write_rows(
            request,
            queryset,
            "Deleted",
            lambda obj, writer, version: writes.delete(obj, writer, expected_version=version),
        )


def _python(model: type[Model], changes: Mapping[str, Any]) -> dict[str, Any]:
    return {name: python_value(model, name, value) for name, value in changes.items()}


def _copy_fields(source: Model, target: Model) -> None:
    for model_field in source._meta.concrete_fields:
        setattr(target, model_field.attname, getattr(source, model_field.attname))


def _row(model: type[Model], merge: FieldMerge) -> dict[str, Any]:
    model_field = model._meta.get_field(merge.name)
    return {"merge": merge, "label": getattr(model_field, "verbose_name", merge.name), "mine_choice": MINE}


def _update_action(changes: Callable[[Any], dict[str, Any]]) -> Callable[[Any, Writer, int], object]:
    """A row write for `write_rows`: `changes(obj)` at the version loaded."""
    return lambda obj, writer, version: writes.update(obj, changes(obj), writer, expected_version=version)


@admin.register(Counter)
class CounterAdmin(VersionedAdmin):
    list_display = ["name", "namespace", "value", "version", "job"]
    list_editable = ["value"]
    # A guarded counter's fencing token moves only with a leader's guarded write.
    readonly_fields = [*VersionedAdmin.readonly_fields, "fencing_token"]
    actions = [*VersionedAdmin.actions, "reset"]

    @admin.action(description="Reset selected counters to 0")
    def reset(self, request: HttpRequest, queryset: QuerySet[Counter]) -> None:
        self.write_rows(request, queryset, "Reset", _update_action(lambda counter: {"value": 0}))


@admin.register(Pod)
class PodAdmin(VersionedAdmin):
    list_display = ["name", "namespace", "phase", "requests", "version", "job"]
    list_filter = [*VersionedAdmin.list_filter, "phase"]


def released(lease: Lease) -> dict[str, Any]:
    """client-go's ReleaseOnCancel: no holder, a 1 s lease renewed and acquired now, the transitions kept."""
    now = timezone.now()
    return {"holder_identity": "", "lease_duration_seconds": 1, "acquire_time": now, "renew_time": now}


@admin.register(Lease)
class LeaseAdmin(VersionedAdmin):
    list_display = ["name", "namespace", "holder_identity", "lease_transitions", "renew_time", "version", "job"]
    list_editable = ["holder_identity"]
    search_fields = [*VersionedAdmin.search_fields, "holder_identity"]
    actions = [*VersionedAdmin.actions, "release"]

    @admin.action(description="Release selected leases (no holder, as ReleaseOnCancel)")
    def release(self, request: HttpRequest, queryset: QuerySet[Lease]) -> None:
        self.write_rows(request, queryset, "Released", _update_action(released))


def usage_now(quota: ResourceQuota) -> dict[str, Any]:
    """What the quota controller's full recalculation finds: the requests of the namespace's pods not Failed."""
    pods = Pod.objects.filter(namespace=quota.namespace).exclude(phase=Pod.Phase.FAILED)
    used: dict[str, Any] = dict.fromkeys(quota.hard, 0)
    for requests in pods.values_list("requests", flat=True):
        for resource, amount in (requests or {}).items():
            if resource in used and isinstance(amount, int | float):
                used[resource] += amount
    return used


@admin.register(ResourceQuota)
class ResourceQuotaAdmin(VersionedAdmin):
    list_display = ["name", "namespace", "hard", "used", "version", "job"]
    actions = [*VersionedAdmin.actions, "recalculate"]

    @admin.action(description="Recalculate the usage of selected quotas now")
    def recalculate(self, request: HttpRequest, queryset: QuerySet[ResourceQuota]) -> None:
        self.write_rows(request, queryset, "Recalculated", _update_action(lambda quota: {"used": usage_now(quota)}))


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
