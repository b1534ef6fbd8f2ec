"""Who is calling the API: a bearer token (`Authorization: Bearer <token>`) or the browser's session.

A token-authenticated request needs no CSRF token (a cross-site page cannot set the
header); a session-authenticated unsafe request must pass Django's CSRF check, as every
form of the dashboard does. No credentials, or a token that is not one, is 401; a
read-only token that writes is 403.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest
from ninja.utils import check_csrf

from occviz.api.models import ApiToken
from occviz.api.status import ApiError
from occviz.store.writes import Writer

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


@dataclass(frozen=True)
class Caller:
    user: Any
    token: ApiToken | None

    @property
    def writer(self) -> Writer:
        """How the object's history names this caller: "alice (token laptop)" or "alice (session)"."""
        how = f"token {self.token.name}" if self.token else "session"
        return Writer("api", f"{self.user.get_username()} ({how})", self.user)

    @property
    def may_write(self) -> bool:
        return self.token is None or not self.token.read_only


def caller(request: HttpRequest) -> Caller:
    """The authenticated caller of `request`; ApiError 401/403 otherwise (and for a failed CSRF check)."""
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "Unauthorized: give a bearer token (Authorization: Bearer <token>)")
        row = ApiToken.authenticate(token.strip())
        if row is None:
            raise ApiError(
                401, "Unauthorized: the bearer token is not valid (unknown, revoked, or its user is inactive)"
            )
        who = Caller(row.user, row)
    elif request.user.is_authenticated:
        if request.method not in SAFE_METHODS and check_csrf(request) is not None:
            raise ApiError(
                403, "Forbidden: CSRF verification failed (a session-authenticated write needs the CSRF token)"
            )
        who = Caller(request.user, None)
    else:
        raise ApiError(401, "Unauthorized: sign in, or give a bearer token (Authorization: Bearer <token>)")
    if request.method not in SAFE_METHODS and not who.may_write:
        raise ApiError(403, f'Forbidden: the token "{who.token.name if who.token else ""}" is read-only')
    return who
