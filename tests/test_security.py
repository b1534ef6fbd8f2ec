"""Safe defaults: a secret key of the installation's own, refusals before a public bind, a clean
`check --deploy` with production settings, websockets that refuse without a traceback and say
why in their close frame, and HEAD wherever GET works."""

from __future__ import annotations

import base64
import itertools
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.contrib.messages import constants
from django.contrib.messages.storage.cookie import CookieStorage
from django.http import HttpResponse
from django.test import Client, RequestFactory, override_settings
from django.utils.safestring import mark_safe

from occviz.asgi import application
from occviz.deploy import SECRET_KEY_FILE, public_bind_problems, stored_secret_key
from occviz.jobs.tasks import create_job
from occviz.live.consumers import MAX_CLOSE_REASON
from tests.conftest import ROOT
from tests.test_live_stream import HOST, ORIGIN, session_cookie  # noqa: F401 (a fixture)

# The key the source used to hold: whoever read it could sign sessions and messages.
PUBLIC_KEY = "occviz-development-key-not-for-production"
SCRIPT = "<script>alert('forged')</script>"
NOWHERE = "postgresql://nobody@127.0.0.1:1/none"  # the settings load without connecting


def manage_in(env: dict[str, str], *args: str, unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """`python manage.py ...` in a new process with `env`, and without the variables in `unset`."""
    inherited = {key: value for key, value in os.environ.items() if key not in unset}
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env={**inherited, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def settings_in_a_new_process(env: dict[str, str], *names: str, unset: tuple[str, ...] = ()) -> dict[str, Any]:
    """The named settings as a freshly started process sees them."""
    values = f"{{name: getattr(settings, name) for name in {names}}}"
    show = f"import json; from django.conf import settings; print(json.dumps({values}))"
    result = manage_in(env, "shell", "-c", show, unset=unset)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


# The secret key


def test_an_unset_secret_key_is_generated_once_and_kept_in_the_data_folder(tmp_path: Path) -> None:
    env = {"OCCVIZ_DATA_DIR": str(tmp_path), "DATABASE_URL": NOWHERE}
    first = settings_in_a_new_process(env, "SECRET_KEY", unset=("SECRET_KEY",))["SECRET_KEY"]
    second = settings_in_a_new_process(env, "SECRET_KEY", unset=("SECRET_KEY",))["SECRET_KEY"]
    assert first == second
    assert first != PUBLIC_KEY
    assert len(first) >= 50
    kept = tmp_path / SECRET_KEY_FILE
    assert kept.read_text().strip() == first
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600, "readable by its owner only"
    other = settings_in_a_new_process({**env, "OCCVIZ_DATA_DIR": str(tmp_path / "other")}, "SECRET_KEY")
    assert other["SECRET_KEY"] != first, "each data folder has its own"
    given = settings_in_a_new_process({**env, "SECRET_KEY": "k" * 60}, "SECRET_KEY")
    assert given["SECRET_KEY"] == "k" * 60


def test_first_starts_at_once_agree_on_one_key(tmp_path: Path) -> None:
    # Threads released by one barrier: the file system settles their race as it does between processes.
    for attempt in range(5):
        folder = tmp_path / str(attempt)
        start = threading.Barrier(12)
        keys: list[str] = []

        def load(folder: Path = folder, start: threading.Barrier = start, keys: list[str] = keys) -> None:
            start.wait()
            keys.append(stored_secret_key(folder))

        threads = [threading.Thread(target=load) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(keys) == 12
        assert len(set(keys)) == 1
        assert [path.name for path in folder.iterdir()] == [SECRET_KEY_FILE], "no temporary file left behind"


def forged_messages_cookie() -> str:
    """A `messages` cookie holding a message marked safe, signed with the key that used to be in the source."""
    with override_settings(SECRET_KEY=PUBLIC_KEY):
        storage = CookieStorage(RequestFactory().get("/"))
        storage.add(constants.INFO, mark_safe(SCRIPT))
        response = HttpResponse()
        storage.update(response)
    return str(response.cookies[storage.cookie_name].value)


def test_a_messages_cookie_forged_with_the_old_public_key_no_longer_renders(
    admin_client: Client, admin_user: User, settings: Any
) -> None:
    assert settings.SECRET_KEY != PUBLIC_KEY
    admin_client.cookies["messages"] = forged_messages_cookie()
    page = admin_client.get("/admin/")
    assert page.status_code == 200
    assert SCRIPT not in page.content.decode()

    # The same cookie against the public key is the attack: a superuser's page runs the script.
    settings.SECRET_KEY = PUBLIC_KEY
    admin_client.force_login(admin_user)
    admin_client.cookies["messages"] = forged_messages_cookie()
    assert SCRIPT in admin_client.get("/admin/").content.decode()


# Serving on a public address


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "::ffff:127.0.0.1"])
def test_loopback_needs_nothing_set(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SECRET_KEY", "ALLOWED_HOSTS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DEBUG", "true")
    assert public_bind_problems(host) == []


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]", "192.168.1.20", "10.0.0.5", "occviz.example.org", ""])
def test_a_public_address_needs_secret_key_and_allowed_hosts(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SECRET_KEY", "ALLOWED_HOSTS", "DEBUG"):
        monkeypatch.delenv(name, raising=False)
    problems = public_bind_problems(host)
    assert len(problems) == 2
    assert problems[0].startswith("SECRET_KEY is not set: ")
    assert problems[1].startswith("ALLOWED_HOSTS is not set: ")

    monkeypatch.setenv("SECRET_KEY", "s" * 60)
    assert [problem.split(" ")[0] for problem in public_bind_problems(host)] == ["ALLOWED_HOSTS"]
    monkeypatch.setenv("ALLOWED_HOSTS", "occviz.example.org")
    assert public_bind_problems(host) == []
    monkeypatch.setenv("DEBUG", "true")
    assert public_bind_problems(host) == [
        "DEBUG is on: its error pages would show code and settings to anyone who can connect"
    ]


# check --deploy

PRODUCTION = {
    "SECRET_KEY": "a-production-key-" + "x7Qp" * 12,
    "ALLOWED_HOSTS": "occviz.example.org",
    "DEBUG": "false",
    "OCCVIZ_HTTPS": "true",
    "OCCVIZ_HSTS_INCLUDE_SUBDOMAINS": "true",
    "OCCVIZ_HSTS_PRELOAD": "true",
}


# The test suite lets the ORM run inside its event loop (tests/conftest.py); a deployment never does.
NOT_IN_PRODUCTION = ("DJANGO_ALLOW_ASYNC_UNSAFE",)


def test_check_deploy_is_clean_with_production_settings() -> None:
    result = manage_in(PRODUCTION, "check", "--deploy", "--fail-level", "WARNING", unset=NOT_IN_PRODUCTION)
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_names_what_is_missing_without_https() -> None:
    without_https = {**PRODUCTION, "OCCVIZ_HTTPS": "false"}
    result = manage_in(without_https, "check", "--deploy", "--fail-level", "WARNING", unset=NOT_IN_PRODUCTION)
    assert result.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in result.stderr


def test_https_settings_come_from_the_environment() -> None:
    names = ("SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_HSTS_SECONDS")
    names += ("SECURE_PROXY_SSL_HEADER",)
    plain = {"OCCVIZ_HTTPS": "false", "DATABASE_URL": NOWHERE}
    unset = ("OCCVIZ_HSTS_SECONDS", "OCCVIZ_TRUST_X_FORWARDED_PROTO")
    assert settings_in_a_new_process(plain, *names, unset=unset) == {
        "SECURE_SSL_REDIRECT": False,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SECURE_HSTS_SECONDS": 0,
        "SECURE_PROXY_SSL_HEADER": None,
    }
    https = settings_in_a_new_process({**plain, "OCCVIZ_HTTPS": "true"}, *names, unset=unset)
    assert https == {
        "SECURE_SSL_REDIRECT": True,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_HSTS_SECONDS": 31_536_000,
        "SECURE_PROXY_SSL_HEADER": None,
    }
    proxied = {**plain, "OCCVIZ_HTTPS": "true", "OCCVIZ_HSTS_SECONDS": "3600", "OCCVIZ_TRUST_X_FORWARDED_PROTO": "1"}
    behind_a_proxy = settings_in_a_new_process(proxied, *names)
    assert behind_a_proxy["SECURE_HSTS_SECONDS"] == 3600
    assert behind_a_proxy["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]


# Websockets: refusals without a traceback, with their reason


async def closing_messages(communicator: WebsocketCommunicator) -> tuple[list[Any], dict[str, Any]]:
    """The JSON messages a socket sends before it closes, and its close."""
    messages = []
    while True:
        output = await communicator.receive_output(10)
        if output["type"] == "websocket.close":
            return messages, output
        messages.append(json.loads(output["text"]))


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_an_unknown_websocket_path_is_refused_with_4404(session_cookie: bytes) -> None:  # noqa: F811
    paths = ("/ws/nowhere/", "/ws/jobs/abc/events/", "/ws/jobs/7/", "/")
    for headers, path in itertools.product(([HOST, ORIGIN], [HOST, ORIGIN, (b"cookie", session_cookie)]), paths):
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await communicator.connect()
        assert connected
        messages, close = await closing_messages(communicator)
        assert close["code"] == 4404
        assert close["reason"] == f"no websocket at {path}: a job's is /ws/jobs/<id>/events/"
        assert messages == [{"type": "error", "code": 4404, "error": close["reason"]}]
        await communicator.wait()  # the application ended without raising


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_job_id_beyond_any_job_is_refused_as_not_found(session_cookie: bytes) -> None:  # noqa: F811
    communicator = WebsocketCommunicator(
        application, "/ws/jobs/99999999999999999999999/events/", headers=[HOST, ORIGIN, (b"cookie", session_cookie)]
    )
    assert (await communicator.connect())[0]
    _, close = await closing_messages(communicator)
    assert close["code"] == 4404
    await communicator.wait()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_long_reason_is_cut_to_fit_the_close_frame() -> None:
    path = "/ws/" + "é" * 200 + "/"
    communicator = WebsocketCommunicator(application, path, headers=[HOST, ORIGIN])
    assert (await communicator.connect())[0]
    messages, close = await closing_messages(communicator)
    assert path in messages[0]["error"], "the error message carries it whole"
    assert len(close["reason"].encode()) <= MAX_CLOSE_REASON
    assert close["reason"].startswith("no websocket at /ws/éé") and close["reason"].endswith("...")
    await communicator.wait()


@pytest.fixture
def daphne_port(database_url: str, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """Daphne serving occviz on the test database, as a deployment runs it; its port and its log."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    log = tmp_path / "daphne.log"
    with log.open("wb") as output:
        daphne = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "occviz.asgi:application"],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": database_url, "DEBUG": "false"},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        for _ in range(300):
            assert daphne.poll() is None, log.read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        yield port, log
    finally:
        daphne.terminate()
        daphne.wait(10)


def close_frame_through(port: int, path: str) -> tuple[int, str, list[Any]]:
    """Open a websocket as any client would (RFC 6455, no library) and read until the server's close frame:
    its code, its reason, and the JSON messages before it."""
    key = base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1:{port}\r\n\r\n"
            ).encode()
        )
        stream = conn.makefile("rb")
        status = stream.readline()
        assert b" 101 " in status, status
        while stream.readline() not in (b"\r\n", b""):
            pass
        messages = []
        while True:
            head = stream.read(2)
            length = head[1] & 0x7F
            if length == 126:
                length = int.from_bytes(stream.read(2), "big")
            elif length == 127:
                length = int.from_bytes(stream.read(8), "big")
            payload = stream.read(length)
            if head[0] & 0x0F == 0x8:
                return int.from_bytes(payload[:2], "big"), payload[2:].decode(), messages
            messages.append(json.loads(payload))


@pytest.mark.slow
def test_close_reasons_reach_a_client_through_daphne(daphne_port: tuple[int, Path]) -> None:
    port, log = daphne_port
    job = create_job("counter", {"strategy": "occ", "writers": 2})
    code, reason, messages = close_frame_through(port, f"/ws/jobs/{job.pk}/events/")
    assert (code, reason) == (4401, "not signed in: open the socket with your session cookie")
    assert messages == [{"type": "error", "code": 4401, "error": reason}]

    code, reason, _ = close_frame_through(port, "/ws/nowhere/")
    assert (code, reason) == (4404, "no websocket at /ws/nowhere/: a job's is /ws/jobs/<id>/events/")
    assert "Traceback" not in log.read_text()


# HEAD answers where GET does


def test_head_works_where_get_does(signed_in: Client) -> None:
    job, other = (create_job("counter", {"strategy": strategy, "writers": 2}) for strategy in ("occ", "atomic"))
    for url in (
        "/",
        "/jobs/new/counter/",
        f"/jobs/{job.pk}/",
        f"/jobs/{job.pk}/replay/",
        f"/jobs/{job.pk}/events.json",
        f"/jobs/{job.pk}/summary.json",
        f"/jobs/{job.pk}/export.csv",
        f"/jobs/compare/?ids={job.pk},{other.pk}",
    ):
        get, head = signed_in.get(url), signed_in.head(url)
        assert get.status_code == head.status_code == 200, url
        assert head["Content-Type"] == get["Content-Type"]
    assert Client().head("/accounts/login/").status_code == 200
    assert signed_in.head(f"/jobs/{job.pk}/cancel/").status_code == 405, "what changes something stays POST"
