"""A real `manage.py serve` on the test database, listening on HTTP and HTTPS, and kubeconfigs for it.

Import the fixtures into a test module (`from tests.api.tls_fixtures import tls_server`).
The serve child has a data folder of its own (tmp_path), so its CA and certificate are
made there, as on a first `make run`.
"""

from __future__ import annotations

import hashlib
import os
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from occviz.tls import CA_FILE, TLS_DIR
from tests.conftest import manage
from tests.test_serve import Served, serve_environment, wait_until

KUBECTL = "/usr/bin/kubectl"


@dataclass
class TlsServer:
    """One serve child: its HTTP and HTTPS addresses, its data folder and the environment it runs with."""

    served: Served
    data_dir: Path
    env: dict[str, str] = field(repr=False)

    @property
    def url(self) -> str:
        return self.served.url

    @property
    def https_url(self) -> str:
        return self.served.tls_url

    @property
    def ca(self) -> Path:
        """The generated CA (with OCCVIZ_TLS_CERT set, serve uses the user's files instead)."""
        return self.data_dir / TLS_DIR / CA_FILE

    def kubeconfig(self, username: str, path: Path) -> Path:
        """`manage.py kubeconfig <username>` written to `path`: it finds this serve's HTTPS address by itself."""
        made = manage("kubeconfig", username, env=self.env)
        assert made.returncode == 0, made.stderr
        path.write_text(made.stdout)
        return path


def https_context(ca: Path) -> ssl.SSLContext:
    """A client context that trusts `ca` alone and checks the host name, as kubectl does."""
    return ssl.create_default_context(cafile=str(ca))


def https_get(url: str, ca: Path, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """GET over HTTPS trusting `ca`; the status and body (also of an error status)."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=https_context(ca)) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def served_fingerprint(port: int, host: str = "127.0.0.1") -> str:
    """SHA-256 of the certificate the server presents (not verified: only looked at), as tls.fingerprint writes it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection((host, port), timeout=10) as raw, context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return ":".join(f"{byte:02X}" for byte in hashlib.sha256(der).digest())


@pytest.fixture
def start_tls_server(database_url: str, tmp_path: Path) -> Iterator[Callable[..., TlsServer]]:
    """`start_tls_server(data_dir=..., **env)`: a serve child answering on HTTP and HTTPS; killed at the end."""
    started: list[Served] = []

    def start(data_dir: Path | None = None, **extra: str) -> TlsServer:
        folder = data_dir or tmp_path / "data"
        env = serve_environment(database_url, folder, **extra)
        served = Served(env, workers=1)
        started.append(served)
        served.started()
        server = TlsServer(served, folder, env)

        def answers() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", served.tls_port), timeout=1):
                    return True
            except OSError:
                return False

        wait_until(answers, 30, "the HTTPS port answering", every=0.1)
        return server

    yield start
    for served in started:
        served.kill()


@pytest.fixture
def tls_server(start_tls_server: Callable[..., TlsServer]) -> TlsServer:
    """A serve child with the certificate made in its data folder."""
    return start_tls_server()


def require_kubectl() -> str:
    """kubectl's path; the test is skipped where it is missing, and failed in CI, which must run it."""
    if not Path(KUBECTL).exists():
        message = f"{KUBECTL} is missing: kubectl is not in Debian's archive, install it from dl.k8s.io"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return KUBECTL
