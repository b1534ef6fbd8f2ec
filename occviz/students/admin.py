"""Admin for student links (revocable one by one or in bulk) and the students who joined through them."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone

from occviz.students.models import Student, StudentLink
from occviz.students.tokens import token_for


@admin.action(description="Revoke the selected student links")
def revoke_links(modeladmin: StudentLinkAdmin, request: HttpRequest, queryset: QuerySet[StudentLink]) -> None:
    revoked = queryset.filter(revoked=False).update(revoked=True, revoked_at=timezone.now())
    modeladmin.message_user(request, f"{revoked} student link{'s' * (revoked != 1)} revoked.", messages.SUCCESS)


@admin.register(StudentLink)
class StudentLinkAdmin(admin.ModelAdmin[StudentLink]):
    list_display = ("id", "job", "created_by", "created", "expires", "revoked", "revoked_at")
    list_filter = ("revoked",)
    search_fields = ("job__id",)
    actions = [revoke_links]
    fields = ("job", "created_by", "created", "expires", "revoked", "revoked_at", "path")
    readonly_fields = ("job", "created_by", "created", "revoked_at", "path")

    @admin.display(description="student page")
    def path(self, link: StudentLink) -> str:
        return reverse("students:page", args=[token_for(link)]) if link.pk else "-"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # made from a job page or `manage.py studentlink`, where the job is known

    def save_model(self, request: HttpRequest, obj: StudentLink, form: object, change: bool) -> None:
        # Ticking "revoked" here is a revocation like the job page's: it keeps its time.
        if obj.revoked and obj.revoked_at is None:
            obj.revoked_at = timezone.now()
        super().save_model(request, obj, form, change)


@admin.register(Student)
class StudentAdmin(admin.ModelAdmin[Student]):
    list_display = ("nickname", "job", "link", "created")
    search_fields = ("nickname",)
    readonly_fields = ("job", "link", "nickname", "created", "window_start", "writes_in_window")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
