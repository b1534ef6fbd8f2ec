"""Requests Django cannot even build, answered 400 instead of failing with a 500.

Django parses the Content-Type header while it builds the request, before any middleware or
error handling runs, and its ASGI handler catches only a bad encoding and a body too large
there: a header over 10,000 characters, or one with `charset*=bogus''x`, raised BadRequest
out of the handler, and Daphne answered 500 with a traceback. This handler answers such a
request as Django answers other bad requests, on any URL: a plain 400 page, or, on the API's
paths, a Kubernetes Status like every other API error.

Under Daphne, Twisted read a POST's form body before the app saw it, and answered a malformed
multipart one itself, with an empty 400; Daphne uses nothing of what Twisted parses, so that is
turned off and the app answers such a body too (the API: 415, its media type is not JSON).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import django
from django.core.exceptions import BadRequest
from django.core.handlers.asgi import ASGIHandler, ASGIRequest
from django.http import HttpResponse, HttpResponseBadRequest
from django.http.response import HttpResponseBase
from django.utils.html import escape

from occviz.api.status import ApiError

logger = logging.getLogger("django.request")
# The API's paths (occviz/urls.py): its errors are Status bodies.
_API_PREFIXES = ("/api/", "/apis/", "/openapi/", "/openapi.json/", "/version/")


def bad_request_response(path: str, error: BadRequest) -> HttpResponse:
    """The 400 for a request Django refused to build: a Status on the API's paths, a plain page elsewhere."""
    if f"{path.rstrip('/')}/".startswith(_API_PREFIXES):
        return ApiError(400, f"the request could not be read: {error}").response()
    return HttpResponseBadRequest(f"<h1>Bad Request (400)</h1><p>{escape(str(error))}</p>".encode())


class BadRequestHandler(ASGIHandler):
    """Django's ASGI handler, answering a request it cannot build (BadRequest) with 400."""

    def create_request(
        self, scope: Mapping[str, Any], body_file: Any
    ) -> tuple[ASGIRequest, None] | tuple[None, HttpResponseBase]:
        try:
            return super().create_request(scope, body_file)
        except BadRequest as error:
            logger.warning("Bad Request (%s): %s", error, scope.get("path", ""), extra={"status_code": 400})
            return None, bad_request_response(str(scope.get("path", "")), error)


def leave_form_bodies_to_django() -> None:
    """Have Daphne's requests skip Twisted's parse of a POST's form body (its `parsePOSTFormSubmission`)."""
    try:
        from daphne.http_protocol import WebRequest
    except ImportError:  # served by another ASGI server
        return
    if getattr(WebRequest, "_occviz_form_bodies_left", False):
        return
    made = WebRequest.__init__

    def made_without_form_parsing(self: Any, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        self._parsePOSTFormSubmission = False

    WebRequest.__init__ = made_without_form_parsing
    WebRequest._occviz_form_bodies_left = True


def get_asgi_application() -> BadRequestHandler:
    """As django.core.asgi.get_asgi_application, with the handler above (and Daphne's form parsing off)."""
    django.setup(set_prefix=False)
    leave_form_bodies_to_django()
    return BadRequestHandler()
