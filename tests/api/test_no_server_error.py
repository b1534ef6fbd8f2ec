"""Requests that were each a 500 with a traceback, sent over real HTTP to a live Daphne: each a clear 4xx now.

A version beyond 64 bits (in a body, a precondition, If-Match), a body nested 990 deep, a
Content-Type Django cannot parse (on any URL, the login page too), OPTIONS and HEAD on an
object, a malformed multipart body, a protobuf body as kubectl sends one: the API answers a
Status like every other API error, the pages a plain 400, and nothing is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from occviz.store.models import Change, Deployment, Lease
from tests.api import tls_fixtures
from tests.api.conftest import LEASES, lease_body
from tests.api.test_kubectl import Kubectl, kubectl
from tests.api.test_resources import url

start_tls_server, tls_server = tls_fixtures.start_tls_server, tls_fixtures.tls_server
__all__ = ["kubectl", "start_tls_server", "tls_server"]  # fixtures, found by name

BEYOND_BIGINT = "9999999999999999999"  # a uint64, as the API server reads versions; past PostgreSQL's bigint
BEYOND_UINT64 = "99999999999999999999"
DEMO = f"{LEASES}/demo"
MERGE = "application/merge-patch+json"
LONG_TYPE = "application/json; x=" + "a" * 10_001
BAD_CHARSET = "application/json; charset*=bogus''x"


def _nested(depth: int) -> str:
    return '{"metadata": ' + '{"a": ' * depth + "1" + "}" * depth + "}"


def _with_version(where: str, version: str) -> dict[str, Any]:
    body = lease_body(holderIdentity="mallory")
    body["metadata"]["resourceVersion"] = version
    return {"preconditions": {"resourceVersion": version}} if where == "preconditions" else body


@dataclass(frozen=True)
class Case:
    method: str
    path: str
    code: int
    reason: str | None
    """The Status reason; None for a page (a plain 400, not JSON)."""
    body: bytes | str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    message: str = ""
    """Text the answer's message must hold."""


CASES = {
    "PUT resourceVersion beyond bigint": Case(
        "PUT", DEMO, 409, "Conflict", json.dumps(_with_version("body", BEYOND_BIGINT)), message="has been modified"
    ),
    "PATCH resourceVersion beyond bigint": Case(
        "PATCH",
        DEMO,
        409,
        "Conflict",
        json.dumps({"metadata": {"resourceVersion": BEYOND_BIGINT}}),
        {"Content-Type": MERGE},
    ),
    "DELETE precondition beyond bigint": Case(
        "DELETE", DEMO, 409, "Conflict", json.dumps(_with_version("preconditions", BEYOND_BIGINT))
    ),
    "PUT If-Match beyond bigint": Case(
        "PUT",
        DEMO,
        412,
        "Conflict",
        json.dumps(lease_body()),
        {"If-Match": f'"{BEYOND_BIGINT}"'},
        message="precondition failed",
    ),
    "PATCH If-Match beyond bigint": Case(
        "PATCH", DEMO, 412, "Conflict", "{}", {"Content-Type": MERGE, "If-Match": f'"{BEYOND_BIGINT}"'}
    ),
    "DELETE If-Match beyond bigint": Case("DELETE", DEMO, 412, "Conflict", None, {"If-Match": f'"{BEYOND_BIGINT}"'}),
    "PUT resourceVersion beyond uint64": Case(
        "PUT",
        DEMO,
        400,
        "BadRequest",
        json.dumps(_with_version("body", BEYOND_UINT64)),
        message="must be a resourceVersion",
    ),
    "PATCH nested 990 deep": Case(
        "PATCH", DEMO, 400, "BadRequest", _nested(990), {"Content-Type": MERGE}, message="exceeded max depth"
    ),
    "PATCH arrays nested 100,000 deep": Case(
        "PATCH", DEMO, 400, "BadRequest", "[" * 100_000 + "]" * 100_000, {"Content-Type": MERGE}
    ),
    "POST nested 990 deep": Case("POST", LEASES, 400, "BadRequest", _nested(990), message="exceeded max depth"),
    "GET API with a Content-Type over 10,000 characters": Case(
        "GET", LEASES, 400, "BadRequest", None, {"Content-Type": LONG_TYPE}, message="Content-Type"
    ),
    "POST API with charset*=bogus": Case(
        "POST", LEASES, 400, "BadRequest", json.dumps(lease_body("x")), {"Content-Type": BAD_CHARSET}
    ),
    "GET version with charset*=bogus": Case("GET", "/version", 400, "BadRequest", None, {"Content-Type": BAD_CHARSET}),
    "GET login page with charset*=bogus": Case(
        "GET", "/accounts/login/", 400, None, None, {"Content-Type": BAD_CHARSET}
    ),
    "POST login page with a Content-Type over 10,000 characters": Case(
        "POST", "/accounts/login/", 400, None, "username=a", {"Content-Type": LONG_TYPE}
    ),
    "GET home page with charset*=bogus": Case("GET", "/", 400, None, None, {"Content-Type": BAD_CHARSET}),
    "OPTIONS on an object": Case("OPTIONS", DEMO, 405, "MethodNotAllowed", message="allowed: GET, PUT, PATCH, DELETE"),
    "OPTIONS on a collection": Case("OPTIONS", LEASES, 405, "MethodNotAllowed"),
    "POST a malformed multipart body": Case(
        "POST", LEASES, 415, "UnsupportedMediaType", b"garbage", {"Content-Type": "multipart/form-data"}
    ),
    "PUT a multipart body": Case(
        "PUT", DEMO, 415, "UnsupportedMediaType", b"--x\r\ngarbage", {"Content-Type": "multipart/form-data; boundary=x"}
    ),
    "POST protobuf, as kubectl create deployment sends it": Case(
        "POST",
        LEASES,
        415,
        "UnsupportedMediaType",
        b"k8s\x00\n\x0e\n\x07apps/v1",
        {"Content-Type": "application/vnd.kubernetes.protobuf"},
        message="accepted media types include: application/json",
    ),
}


@pytest.fixture
def demo(api: requests.Session) -> dict[str, Any]:
    made = api.post(url(api, LEASES), json=lease_body())
    assert made.status_code == 201
    return dict(made.json())


@pytest.mark.parametrize("name", list(CASES))
def test_a_request_that_was_a_server_error_is_a_clear_client_error(
    api: requests.Session, demo: dict[str, Any], name: str
) -> None:
    case = CASES[name]
    changes = Change.objects.count()
    answer = api.request(case.method, url(api, case.path), data=case.body, headers=case.headers, timeout=30)
    assert answer.status_code == case.code, answer.text[:500]
    if case.reason is None:
        assert answer.headers["Content-Type"].startswith("text/html")
        assert "Bad Request (400)" in answer.text
    else:
        status = answer.json()
        assert (status["kind"], status["code"], status["reason"]) == ("Status", case.code, case.reason)
        assert case.message in status["message"]
    assert Lease.objects.get(name="demo").resource_version == 1 and Change.objects.count() == changes


def test_head_on_an_object_is_a_405_status_without_a_body(api: requests.Session, demo: dict[str, Any]) -> None:
    answer = api.head(url(api, DEMO))
    assert answer.status_code == 405 and answer.headers["Content-Type"] == "application/json"
    assert answer.content == b""  # HEAD: the Status's headers, no body


@pytest.mark.slow
def test_no_header_value_makes_a_server_error(api: requests.Session, demo: dict[str, Any]) -> None:
    """Content-Type, If-Match and Accept drawn from what a client could send, on the API and on a page."""
    header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=60).map(str.strip)
    content_types = st.one_of(
        header_text,
        st.builds(
            "{}; {}*={}'{}'{}".format,
            st.sampled_from(["application/json", MERGE, "text/plain", "multipart/form-data"]),
            st.sampled_from(["charset", "boundary", "x"]),
            header_text,
            header_text,
            header_text,
        ),
    )
    paths = st.sampled_from([DEMO, LEASES, "/version", "/accounts/login/", "/"])

    @given(
        method=st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"]),
        path=paths,
        content_type=content_types,
        if_match=header_text,
        accept=header_text,
    )
    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def no_server_error(method: str, path: str, content_type: str, if_match: str, accept: str) -> None:
        headers = {"Content-Type": content_type, "If-Match": if_match, "Accept": accept}
        encoded = {key: value.encode("latin-1") for key, value in headers.items()}
        answer = api.request(method, url(api, path), data=b"{}", headers=encoded, timeout=30)  # type: ignore[arg-type]
        assert answer.status_code < 500, (method, path, headers, answer.text[:300])

    no_server_error()


@pytest.mark.slow
def test_kubectl_create_deployment_is_told_the_api_takes_json(kubectl: Kubectl, tmp_path: Path) -> None:
    """kubectl sends protobuf for `create deployment` (and does not retry with JSON): a 415 naming JSON.
    The same Deployment as a manifest goes as JSON, and is created."""
    refused = kubectl.run("create", "deployment", "api", "--image=nginx", ok=False)
    assert refused.returncode == 1
    assert refused.stderr == (
        "error: failed to create deployment: the body of the request was in an unknown format "
        "(application/vnd.kubernetes.protobuf) - accepted media types include: application/json\n"
    )
    assert not Deployment.objects.filter(name="api").exists()
    manifest = tmp_path / "deployment.yaml"
    manifest.write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: api\n  namespace: default\nspec:\n  replicas: 2\n"
    )
    assert kubectl.run("create", "-f", str(manifest)).stdout == "deployment.apps/api created\n"
    assert Deployment.objects.get(name="api").replicas == 2
