"""The websocket's edges: whose origin may open it, what it refuses, how it closes on a client that breaks the rules."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from occviz.asgi import application
from occviz.bench.wsclient import Closed, Refused, WsClient
from occviz.live.origin import allowed_origin
from tests.test_history_reads import cookie, daphne  # noqa: F401 (fixtures)
from tests.test_live_stream import counter_job, messages_until_close, session_cookie  # noqa: F401 (a fixture)


def scope(host: str | None, origin: str | None, scheme: str = "ws", **extra: Any) -> dict[str, Any]:
    headers = [(b"host", host.encode())] if host is not None else []
    headers += [(b"origin", origin.encode())] if origin is not None else []
    return {"type": "websocket", "scheme": scheme, "headers": headers, **extra}


@pytest.mark.parametrize(
    ("host", "origin", "scheme", "allowed"),
    [
        ("127.0.0.1:8000", "http://127.0.0.1:8000", "ws", True),
        ("127.0.0.1:8000", "http://127.0.0.1:9000", "ws", False),  # another port of the same host
        ("127.0.0.1:8000", "http://127.0.0.1", "ws", False),
        ("127.0.0.1", "http://127.0.0.1:80", "ws", True),  # the scheme's default port, said or not
        ("localhost:8443", "https://localhost:8443", "wss", True),
        ("localhost:8443", "http://localhost:8443", "wss", False),  # another scheme
        ("localhost:8000", "https://localhost:8000", "ws", False),
        ("evil.example:8000", "http://evil.example:8000", "ws", False),  # a host ALLOWED_HOSTS does not name
        ("127.0.0.1:8000", "null", "ws", False),
        ("127.0.0.1:8000", "http://127.0.0.1:notaport", "ws", False),
        ("127.0.0.1:8000", None, "ws", False),
    ],
)
def test_the_origin_must_be_the_sockets_own_scheme_host_and_port(
    host: str, origin: str | None, scheme: str, allowed: bool
) -> None:
    assert allowed_origin(scope(host, origin, scheme)) is allowed


def test_a_socket_without_a_host_header_is_judged_by_the_server_address() -> None:
    assert allowed_origin(scope(None, "http://127.0.0.1:8000", server=("127.0.0.1", 8000)))
    assert not allowed_origin(scope(None, "http://127.0.0.1:9000", server=("127.0.0.1", 8000)))
    assert not allowed_origin(scope(None, "http://127.0.0.1:8000"))


def test_csrf_trusted_origins_are_allowed_with_their_port(settings: Any) -> None:
    settings.CSRF_TRUSTED_ORIGINS = ["https://class.example.com", "https://*.school.example"]
    assert allowed_origin(scope("127.0.0.1:8000", "https://class.example.com"))
    assert allowed_origin(scope("127.0.0.1:8000", "https://room-4.school.example"))
    assert not allowed_origin(scope("127.0.0.1:8000", "https://class.example.com:8443"))
    assert not allowed_origin(scope("127.0.0.1:8000", "http://class.example.com"))
    assert not allowed_origin(scope("127.0.0.1:8000", "https://school.example.evil"))


def test_a_proxy_that_is_trusted_says_the_scheme(settings: Any) -> None:
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.ALLOWED_HOSTS = ["class.local"]
    behind = scope("class.local", "https://class.local")
    behind["headers"].append((b"x-forwarded-proto", b"https"))
    assert allowed_origin(behind)
    assert not allowed_origin(scope("class.local", "https://class.local"))


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_another_port_of_the_same_host_is_refused_at_the_handshake(session_cookie: bytes) -> None:  # noqa: F811
    job = await sync_to_async(counter_job)()
    path = f"/ws/jobs/{job.pk}/events/"
    for origin, opens in ((b"http://127.0.0.1:9000", False), (b"http://127.0.0.1:8000", True)):
        headers = [(b"host", b"127.0.0.1:8000"), (b"origin", origin), (b"cookie", session_cookie)]
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await communicator.connect()
        assert connected is opens
        await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_blank_after_and_a_string_after_are_refused(session_cookie: bytes) -> None:  # noqa: F811
    job = await sync_to_async(counter_job)()  # queued: the stream waits
    headers = [(b"host", b"127.0.0.1"), (b"origin", b"http://127.0.0.1"), (b"cookie", session_cookie)]
    blank = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/events/?after=", headers=headers)
    assert (await blank.connect())[0]
    error, code = [message async for message in messages_until_close(blank)]
    assert code == 4400 and error["code"] == 4400 and "after=''" in error["error"]
    communicator = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/events/?after=0", headers=headers)
    assert (await communicator.connect())[0]
    assert (await communicator.receive_json_from())["type"] == "hello"
    await communicator.send_to(text_data='{"type": "resume", "after": "5"}')
    error = await communicator.receive_json_from()
    assert error["code"] == 4400 and "not a string" in error["error"]
    await communicator.send_to(text_data='{"type": "resume", "after": 0}')
    assert await communicator.receive_nothing(0.3), "a good resume of a queued job sends nothing yet"
    await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_message_over_a_megabyte_closes_with_1009(daphne: tuple[int, Path], cookie: str) -> None:  # noqa: F811
    port, log = daphne
    job = await sync_to_async(counter_job)()
    client = await WsClient.connect(port, f"/ws/jobs/{job.pk}/events/", cookie)
    assert (await client.receive_json())["type"] == "hello"
    client.send_text("x" * (1024 * 1024 + 1))
    with pytest.raises(Closed) as closed:
        await asyncio.wait_for(client.receive_text(), 10)
    assert closed.value.code == 1009
    await client.close()
    # A page on another port of this host cannot open one through Daphne either.
    with pytest.raises(Refused):
        await WsClient.connect(port, f"/ws/jobs/{job.pk}/events/", cookie, origin=f"http://127.0.0.1:{port + 1}")
    assert "Traceback" not in log.read_text()
