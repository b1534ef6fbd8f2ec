"""kubeconfig: print a kubeconfig for one user, as `kind get kubeconfig` does for a kind cluster.

    python manage.py kubeconfig alice > kubeconfig
    kubectl --kubeconfig kubeconfig get leases

It points at the HTTPS address of the serve running on this data folder, read from its
lock (with none running, 127.0.0.1 at OCCVIZ_TLS_PORT), since kubectl sends a token only
over TLS. It carries the CA that signed serve's certificate (occviz/tls.py) so nothing else
needs trusting, and a new bearer token of the user's, named "kubeconfig" (revoked like any
other token).
"""

from __future__ import annotations

import base64
import ipaddress
import json
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from occviz.api.models import ApiToken
from occviz.supervisor import ServeLock
from occviz.tls import tls_files

CLUSTER = "occviz"
TOKEN_NAME = "kubeconfig"


def kubeconfig_yaml(server: str, authority_pem: bytes | None, user: str, token: str, namespace: str) -> str:
    """The kubeconfig, laid out as kubectl writes one. Every string is JSON-quoted, which YAML reads as is."""
    quote = json.dumps
    authority = f"    certificate-authority-data: {base64.b64encode(authority_pem).decode()}\n" if authority_pem else ""
    return (
        "apiVersion: v1\n"
        "clusters:\n"
        "- cluster:\n"
        f"{authority}"
        f"    server: {quote(server)}\n"
        f"  name: {CLUSTER}\n"
        "contexts:\n"
        "- context:\n"
        f"    cluster: {CLUSTER}\n"
        f"    namespace: {quote(namespace)}\n"
        f"    user: {quote(user)}\n"
        f"  name: {CLUSTER}\n"
        f"current-context: {CLUSTER}\n"
        "kind: Config\n"
        "preferences: {}\n"
        "users:\n"
        f"- name: {quote(user)}\n"
        "  user:\n"
        f"    token: {quote(token)}\n"
    )


def default_server() -> str:
    """The HTTPS address of the serve running on this data folder; with none running, the one OCCVIZ_TLS_PORT gives."""
    running = ServeLock(settings.DATA_DIR).holder()
    if running is None:
        if not settings.OCCVIZ_TLS_PORT:
            raise CommandError("serve has no HTTPS port (OCCVIZ_TLS_PORT=0): give --server https://...")
        return f"https://127.0.0.1:{settings.OCCVIZ_TLS_PORT}"
    if not running.https:
        raise CommandError(
            f"The serve running on this data folder ({running}) has no HTTPS port: give --server https://..."
        )
    address = urlsplit(running.https)
    try:
        everywhere = ipaddress.ip_address(address.hostname or "").is_unspecified
    except ValueError:  # a host name
        everywhere = False
    # Listening on every address (0.0.0.0, ::), it is reached here at 127.0.0.1, which its certificate names.
    return f"https://127.0.0.1:{address.port}" if everywhere else running.https


class Command(BaseCommand):
    help = "Print a kubeconfig for a user: serve's HTTPS address, its CA and a new API token."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--server",
            help="the HTTPS address kubectl is to use (default: the running serve's, else "
            f"https://127.0.0.1:{settings.OCCVIZ_TLS_PORT})",
        )
        parser.add_argument("--namespace", default="default", help="the context's namespace (default: default)")

    def handle(self, *args: Any, **options: Any) -> None:
        server, username = (options["server"] or default_server()).rstrip("/"), options["username"]
        if urlsplit(server).scheme != "https":
            raise CommandError(f"--server {server}: give an https:// address; kubectl sends no token over plain HTTP.")
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"There is no user {username!r}: no kubeconfig made, no token created.")
        if not user.is_active:
            raise CommandError(f"The user {username!r} is inactive: a token of theirs would be refused.")
        try:
            authority = tls_files().authority
        except ImproperlyConfigured as error:
            raise CommandError(f"Cannot find serve's certificate: {error}") from None
        _, token = ApiToken.issue(user, TOKEN_NAME)
        self.stdout.write(
            kubeconfig_yaml(
                server, authority.read_bytes() if authority else None, username, token, options["namespace"]
            ),
            ending="",
        )
