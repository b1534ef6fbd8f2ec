"""Kubernetes `Status` bodies: every error the API answers, typed as the API server types them."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpResponse

# HTTP code -> the Status reason the API server gives it.
REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Gone",
    412: "Conflict",  # the API server has no reason of its own for a failed precondition
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
}


class ApiError(Exception):
    """An error the API answers with a Status body: `code`, its `reason`, a clear `message`, `details`."""

    def __init__(
        self, code: int, message: str, *, reason: str | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason or REASONS.get(code, "Unknown")
        self.message = message
        self.details = details

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body

    def response(self) -> HttpResponse:
        response = json_response(self.body(), status=self.code)
        if self.code == 401:
            response["WWW-Authenticate"] = 'Bearer realm="occviz"'
        return response


def resource_details(name: str, group: str, plural: str) -> dict[str, Any]:
    """`details` of a Status about one object, as the API server fills it (group left out for the core group)."""
    details: dict[str, Any] = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = plural
    return details


def json_response(data: Any, *, status: int = 200, etag: str | None = None) -> HttpResponse:
    response = HttpResponse(json.dumps(data), status=status, content_type="application/json")
    if etag is not None:
        response["ETag"] = f'"{etag}"'
    return response
