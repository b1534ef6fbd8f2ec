"""Typed readers for the environment variables that configure occviz.

Each one fails loudly with ImproperlyConfigured, naming the variable and what
it expected, so a typo in a setting stops the start instead of changing behaviour.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def envstr(name: str, default: str) -> str:
    return os.environ.get(name, default)


def envbool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean: use one of 1/0, true/false, yes/no, on/off.")


def envint(name: str, default: int, *, minimum: int = 1, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number.") from None
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise ImproperlyConfigured(f"{name}={value} is out of range: it must be {bounds}.")
    return value


def envpath(name: str, default: Path) -> Path:
    """A folder: absolute as given, or relative to the working directory the process started in."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    if not raw.strip():
        raise ImproperlyConfigured(f"{name} is set but empty: give a folder, or unset it for the default.")
    return Path(raw.strip()).expanduser().resolve()


def envlist(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    items = [item.strip() for item in raw.split(",") if item.strip()]
    if not items:
        raise ImproperlyConfigured(f"{name} is set but empty: give a comma-separated list.")
    return items


def database_from_url(url: str) -> dict[str, object]:
    """Django DATABASES entry for a postgres:// URL (host may be a socket folder: ?host=/path)."""
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ImproperlyConfigured(
            "DATABASE_URL must be a PostgreSQL URL (postgresql://user:password@host:port/name), "
            f"got scheme {parts.scheme!r}: occviz runs on PostgreSQL only."
        )
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured("DATABASE_URL names no database: add /<name> after the host.")
    query = dict(pair.split("=", 1) for pair in parts.query.split("&") if "=" in pair)
    try:
        port = parts.port
    except ValueError:
        raise ImproperlyConfigured(f"DATABASE_URL has an invalid port: {url!r}.") from None
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or "") or "postgres",
        "PASSWORD": unquote(parts.password or ""),
        "HOST": unquote(query.get("host", "")) or parts.hostname or "",
        "PORT": str(port or ""),
    }


def redis_url(name: str) -> str | None:
    raw = os.environ.get(name)
    if not raw:
        return None
    if urlsplit(raw).scheme not in {"redis", "rediss", "unix"}:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a redis:// URL.")
    return raw
