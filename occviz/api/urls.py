"""Routes of the Kubernetes-compatible API (/api, /apis, /version, /openapi.json) and of the token page."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, path, re_path

from occviz.api import openapi, tokens
from occviz.api.api import api
from occviz.api.status import ApiError


def not_found(request: HttpRequest, rest: str = "") -> HttpResponse:
    """Any other path under the API's prefixes: a 404 Status, as the API server answers, not an HTML page."""
    return ApiError(404, "the server could not find the requested resource").response()


urlpatterns: list[URLPattern | URLResolver] = [
    path("", api.urls),
    path("openapi/v3", openapi.index, name="openapi_v3"),
    path("openapi/v3/<path:key>", openapi.group_version, name="openapi_v3_group_version"),
    path("tokens/", tokens.token_list, name="api_tokens"),
    path("tokens/<int:token_id>/revoke/", tokens.token_revoke, name="api_token_revoke"),
    re_path(r"^(?:api|apis|openapi)(?P<rest>/.*)?$", not_found),
]
