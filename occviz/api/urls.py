"""Routes of the Kubernetes-compatible API: /api, /apis, /version and the OpenAPI document."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver

urlpatterns: list[URLPattern | URLResolver] = []
