"""Admin for API tokens: listed and revoked here, made by their user (dashboard or `manage.py apitoken`)."""

from __future__ import annotations

from django.contrib import admin

from occviz.api.models import ApiToken
from occviz.store.admin import ReadOnlyAdmin


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    """Tokens are made by their user (dashboard or `manage.py apitoken`); here they are listed and revoked."""

    list_display = ["name", "user", "prefix", "read_only", "created_at", "last_used_at"]
    list_filter = ["read_only", "user"]
    search_fields = ["name", "prefix", "user__username"]
