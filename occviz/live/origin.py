"""Which pages may open a websocket: the site's own origin (scheme, host and port), as Django's CSRF check has it.

A browser sends the page's origin with every websocket handshake, and sends the session
cookie whatever the page. Channels' AllowedHostsOriginValidator compares only the Origin's
host with ALLOWED_HOSTS, so a page served on another port of the same host (another app of
the machine, a student's server on 127.0.0.1:9000) could open sockets with a signed-in
user's cookie. Here the Origin must equal the origin the socket was opened on: scheme
(`ws` is `http`, `wss` is `https`, or what a trusted proxy says), the Host header's host,
which ALLOWED_HOSTS must allow, and its port (the scheme's default when none is given), or
be one of CSRF_TRUSTED_ORIGINS (`https://*.example.com` allows its subdomains). A socket
from anywhere else is refused during the handshake (HTTP 403); so is one without an Origin.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

DEFAULT_PORTS = {"http": 80, "https": 443}


def _headers(scope: dict[str, Any]) -> dict[bytes, bytes]:
    return {name.lower(): value for name, value in scope.get("headers", [])}


def _scheme(scope: dict[str, Any], headers: dict[bytes, bytes]) -> str:
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:
        header, secure = proxy
        name = header.removeprefix("HTTP_").replace("_", "-").lower().encode()
        forwarded = headers.get(name, b"").decode("latin-1").split(",")[0].strip()
        if forwarded:
            return "https" if forwarded == secure else "http"
    return "https" if scope.get("scheme") in ("wss", "https") else "http"


def own_origin(scope: dict[str, Any]) -> tuple[str, str, int] | None:
    """(scheme, host, port) the socket was opened on, or None if its host is not an allowed one."""
    headers = _headers(scope)
    scheme = _scheme(scope, headers)
    raw_host = headers.get(b"host", b"").decode("latin-1")
    if not raw_host and scope.get("server"):
        server_host, server_port = scope["server"]
        raw_host = f"{server_host}:{server_port}" if server_port else str(server_host)
    host, port = split_domain_port(raw_host)
    if not host or not validate_host(host, settings.ALLOWED_HOSTS):
        return None
    if port and not port.isdigit():
        return None
    return scheme, host, int(port) if port else DEFAULT_PORTS[scheme]


def origin_of(value: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an Origin header (or a CSRF_TRUSTED_ORIGINS entry), None if it is not one."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return scheme, host.lower(), port if port is not None else DEFAULT_PORTS[scheme]


def trusted(origin: tuple[str, str, int]) -> bool:
    """Is it one of CSRF_TRUSTED_ORIGINS (a `*.` host allows that domain's subdomains)?"""
    scheme, host, port = origin
    for entry in settings.CSRF_TRUSTED_ORIGINS:
        allowed = origin_of(entry.replace("*.", "wildcard.", 1))
        if allowed is None or allowed[0] != scheme or allowed[2] != port:
            continue
        if "*." in entry:
            if is_same_domain(host, "." + allowed[1].removeprefix("wildcard.")):
                return True
        elif allowed[1] == host:
            return True
    return False


def allowed_origin(scope: dict[str, Any]) -> bool:
    raw = _headers(scope).get(b"origin")
    origin = origin_of(raw.decode("latin-1")) if raw else None
    if origin is None:
        return False
    return origin == own_origin(scope) or trusted(origin)


class SameOriginValidator:
    """ASGI middleware: websocket handshakes only from the site's own origin (or a trusted one)."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not allowed_origin(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
