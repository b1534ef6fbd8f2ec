"""serve's HTTPS port: a certificate for 127.0.0.1 and localhost made once and kept, or the user's own by
setting, a clear refusal of settings that cannot work, and the API over HTTPS with a bearer token."""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured

from occviz import tls
from tests.api import tls_fixtures
from tests.api.tls_fixtures import TlsServer, https_get, served_fingerprint
from tests.conftest import manage
from tests.servers import free_port
from tests.test_serve import Served, serve_environment

# Fixtures are found by name in the module (tests/api/conftest.py is the API's own).
start_tls_server = tls_fixtures.start_tls_server
tls_server = tls_fixtures.tls_server


@pytest.mark.slow
def test_serve_listens_on_http_and_on_https_verified_by_its_ca_for_127_0_0_1_and_localhost(
    tls_server: TlsServer,
) -> None:
    with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):  # the system's CAs do not know it
        https_get(f"{tls_server.https_url}/accounts/login/", Path(ssl.get_default_verify_paths().cafile or "/dev/null"))
    for host in ("127.0.0.1", "localhost"):
        status, body = https_get(f"https://{host}:{tls_server.served.tls_port}/accounts/login/", tls_server.ca)
        assert status == 200 and b"password" in body
    banner = tls_server.served.output
    assert banner.count(f"HTTPS for kubectl and API clients: {tls_server.https_url}/") == 1
    assert "python manage.py kubeconfig demo > kubeconfig\n" in banner  # it finds this serve's port
    key = tls_server.data_dir / tls.TLS_DIR / tls.KEY_FILE
    assert key.stat().st_mode & 0o777 == 0o600


@pytest.mark.slow
def test_the_certificate_is_made_once_and_served_again_on_the_next_start(
    start_tls_server: Callable[..., TlsServer],
) -> None:
    first = start_tls_server()
    made = tls.fingerprint(first.data_dir / tls.TLS_DIR / tls.CERT_FILE)
    assert served_fingerprint(first.served.tls_port) == made
    assert f"certificate SHA-256 {made}" in first.served.output
    first.served.stop()

    again = start_tls_server(data_dir=first.data_dir)
    assert served_fingerprint(again.served.tls_port) == made
    assert https_get(f"{again.https_url}/accounts/login/", again.ca)[0] == 200


@pytest.mark.slow
def test_serve_uses_the_users_own_certificate_by_setting(
    start_tls_server: Callable[..., TlsServer], tmp_path: Path
) -> None:
    own = tls.generated_files(tmp_path / "own")  # any CA and certificate: here, one made the same way elsewhere
    server = start_tls_server(
        OCCVIZ_TLS_CERT=str(own.certificate), OCCVIZ_TLS_KEY=str(own.key), OCCVIZ_TLS_CA=str(own.authority)
    )
    assert served_fingerprint(server.served.tls_port) == tls.fingerprint(own.certificate)
    assert own.authority is not None
    assert https_get(f"{server.https_url}/accounts/login/", own.authority)[0] == 200
    assert not (server.data_dir / tls.TLS_DIR).exists()
    assert f"its CA: {own.authority}" in server.served.output


@pytest.mark.slow
def test_tls_port_0_serves_http_alone_and_makes_no_certificate(database_url: str, tmp_path: Path) -> None:
    served = Served(serve_environment(database_url, tmp_path), workers=1, args=("--tls-port", "0"))
    try:
        served.started()
        [web] = [child for child in served.children() if child.cmdline()[1:3] == ["-m", "daphne"]]
        endpoints = [arg for arg in web.cmdline() if arg.startswith(("tcp:", "ssl:"))]
        assert len(endpoints) == 1 and endpoints[0].startswith("tcp:"), web.cmdline()  # plain HTTP, no TLS endpoint
        assert "HTTPS" not in served.output
        assert not (tmp_path / tls.TLS_DIR).exists()
        refused = manage("kubeconfig", "demo", env=serve_environment(database_url, tmp_path))
        assert refused.returncode == 1
        running = f"{served.url}/ (pid {served.process.pid})"
        assert f"The serve running on this data folder ({running}) has no HTTPS port" in refused.stderr
    finally:
        served.kill()


def test_settings_that_cannot_work_are_refused_naming_the_setting(tmp_path: Path) -> None:
    own = tls.generated_files(tmp_path / "own")
    other = tls.generated_files(tmp_path / "other")
    cases = {
        ("", str(own.key), ""): "OCCVIZ_TLS_CERT is not set",
        (str(own.certificate), "", ""): "OCCVIZ_TLS_KEY is not set",
        ("", "", str(own.authority)): "OCCVIZ_TLS_CERT is not set",
        (str(tmp_path / "nowhere.pem"), str(own.key), ""): f"there is no file {tmp_path / 'nowhere.pem'}",
        (str(own.certificate), str(other.key), ""): "is not the key of the certificate in OCCVIZ_TLS_CERT",
        (str(own.key), str(own.key), ""): "holds no PEM certificate",
        (str(own.certificate), str(own.certificate), ""): "holds no PEM private key",
        (str(own.certificate), str(own.key), str(tmp_path / "ca.pem")): "OCCVIZ_TLS_CA=",
    }
    for (certificate, key, authority), message in cases.items():
        with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
            tls.configured_files(certificate, key, authority)


def test_processes_that_start_together_all_use_the_one_set_that_was_made_first(tmp_path: Path) -> None:
    with ThreadPoolExecutor(8) as pool:
        made = list(pool.map(lambda _: tls.generated_files(tmp_path), range(8)))
    assert len({tls.fingerprint(files.certificate) for files in made}) == 1
    assert [path.name for path in tmp_path.iterdir()] == [tls.TLS_DIR]  # no draft left behind


def test_a_generated_set_with_a_file_missing_says_how_to_have_a_new_one_made(tmp_path: Path) -> None:
    made = tls.generated_files(tmp_path)
    made.key.unlink()
    with pytest.raises(ImproperlyConfigured, match=re.escape(f"delete {tmp_path / tls.TLS_DIR}")):
        tls.generated_files(tmp_path)


@pytest.mark.django_db(transaction=True)
def test_serve_refuses_a_missing_certificate_file_before_changing_anything(database_url: str, tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    refused = manage(
        "serve",
        "--port",
        str(free_port()),
        "--tls-port",
        str(free_port()),
        env=serve_environment(database_url, tmp_path, OCCVIZ_TLS_CERT=str(missing), OCCVIZ_TLS_KEY=str(missing)),
    )
    assert refused.returncode == 2, refused.stderr
    assert f"Cannot serve HTTPS: OCCVIZ_TLS_CERT='{missing}': there is no file {missing}." in refused.stderr
    assert not User.objects.filter(username="demo").exists()


@pytest.mark.django_db(transaction=True)
def test_serve_refuses_an_https_port_that_is_its_http_port(database_url: str, tmp_path: Path) -> None:
    port = str(free_port())
    refused = manage("serve", "--port", port, "--tls-port", port, env=serve_environment(database_url, tmp_path))
    assert refused.returncode == 2
    assert f"--tls-port {port}: give another TCP port than --port" in refused.stderr


@pytest.mark.slow
def test_the_api_answers_over_https_with_a_bearer_token_and_refuses_without(tls_server: TlsServer) -> None:
    from occviz.api.models import ApiToken

    _, token = ApiToken.issue(User.objects.create_user("alice"), "test")
    path = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
    status, body = https_get(f"{tls_server.https_url}{path}", tls_server.ca, {"Authorization": f"Bearer {token}"})
    assert status == 200, body
    assert json.loads(body)["kind"] == "LeaseList"
    status, body = https_get(f"{tls_server.https_url}{path}", tls_server.ca)
    assert status == 401, body
    assert json.loads(body)["reason"] == "Unauthorized"
