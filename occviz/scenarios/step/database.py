"""Which database a step job's script runs on: the app's PostgreSQL, or a MySQL server the settings allow.

occviz keeps its own data on PostgreSQL; a MySQL-compatible server is only a target of
step scripts (Hermitage's suite on MariaDB, say). Only a server listed in the setting
OCCVIZ_MYSQL_URLS may be named: a form that could point the app at any host would make
it a client for hire.
"""

from __future__ import annotations

import time
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError

from occviz.steps.mysql import MySQLDialect, Server, drop_stale_databases, same_server

_RELEASE_PATIENCE_S = 3.0


def allowed_servers() -> list[str]:
    return list(settings.OCCVIZ_MYSQL_URLS)


def clean_database(url: str) -> str:
    """The URL as given if it names a server OCCVIZ_MYSQL_URLS allows ("" for the app's PostgreSQL)."""
    url = (url or "").strip()
    if not url:
        return ""
    try:
        Server.from_url(url)
    except ValueError as wrong:
        raise ValidationError(f"{wrong}.") from None
    allowed = allowed_servers()
    if not same_server(url, allowed):
        listed = ", ".join(Server.from_url(entry).label for entry in allowed) if allowed else "none"
        raise ValidationError(
            f"{Server.from_url(url).label} is not a server this occviz may run scripts on: only those in the "
            f"setting OCCVIZ_MYSQL_URLS may be given (now: {listed})."
        )
    return url


class DatabaseField(forms.CharField):
    """An optional mysql:// URL, one of OCCVIZ_MYSQL_URLS; empty for the app's own PostgreSQL."""

    def __init__(self, **options: Any) -> None:
        options.setdefault("required", False)
        options.setdefault("max_length", 300)
        options.setdefault("label", "MySQL server")
        options.setdefault(
            "help_text",
            "Empty: the app's PostgreSQL. Or a MySQL or MariaDB server listed in OCCVIZ_MYSQL_URLS, "
            "e.g. mysql://root@127.0.0.1:3306/ (a database of its own is made and dropped for each run).",
        )
        super().__init__(**options)

    def clean(self, value: Any) -> str:
        return clean_database(super().clean(value) or "")


def mysql_dialect(url: str, name: str) -> MySQLDialect:
    """A run's dialect on the server; databases that runs killed outright left there are dropped first."""
    server = Server.from_url(url)
    drop_stale_databases(server)
    return MySQLDialect(server, name)


def mysql_released(dialect: MySQLDialect) -> bool:
    """Whether the server shows no session on the run's database any more (a closed one may linger a moment)."""
    deadline = time.monotonic() + _RELEASE_PATIENCE_S
    while True:
        left = dialect.sessions_left()
        if left == 0 or time.monotonic() > deadline:
            return left == 0
        time.sleep(0.05)


def described(dialect: MySQLDialect) -> str:
    """The server as a summary names it: "mariadb 10.11.19-MariaDB at mysql://root@127.0.0.1:3306/"."""
    return f"{dialect.flavor} {dialect.version} at {dialect.server.label}"
