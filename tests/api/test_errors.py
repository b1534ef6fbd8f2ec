"""Bad input gets a typed Kubernetes Status, never a 500, and changes nothing (Django's test client: many cases)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from occviz.api.models import ApiToken
from occviz.store.models import Change, Lease
from tests.api.conftest import COUNTERS, LEASES, PODS, QUOTAS, lease_body

KUBECTL_TABLE_ACCEPT = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)


@pytest.fixture
def client_with_token(client: Client, alice: User) -> Client:
    token = ApiToken.issue(alice, "test")[1]
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return client


def _send(client: Client, method: str, path: str, body: Any, content_type: str = "application/json") -> Any:
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    return getattr(client, method)(path, data=data, content_type=content_type)


def _status(response: Any, code: int, reason: str) -> dict[str, Any]:
    assert response.status_code == code, response.content
    body = response.json()
    assert (body["kind"], body["status"], body["code"], body["reason"]) == ("Status", "Failure", code, reason)
    return dict(body)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("{not json", "invalid JSON"),
        ([1, 2], "must be a JSON object"),
        (lease_body(leaseDurationSeconds="15"), "spec.leaseDurationSeconds: Input should be a valid integer"),
        (lease_body(renewTime="yesterday"), "spec.renewTime"),
        ({"metadata": {"name": 7}}, "metadata.name"),
        ({"metadata": {"name": "x", "resourceVersion": 3}}, "metadata.resourceVersion"),
        ({"apiVersion": "v1", "metadata": {"name": "x"}}, "does not match the expected API version"),
        ({"kind": "Pod", "metadata": {"name": "x"}}, "does not match the expected kind"),
        ({"metadata": {"name": "x", "namespace": "other"}}, "does not match the namespace"),
    ],
)
def test_malformed_or_mistyped_bodies_are_400_saying_which_field(
    client_with_token: Client, body: Any, field: str
) -> None:
    status = _status(_send(client_with_token, "post", LEASES, body), 400, "BadRequest")
    assert field in status["message"]
    assert not Lease.objects.exists() and not Change.objects.exists()


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (LEASES, lease_body("Not_A_Name"), "metadata.name"),
        (LEASES, lease_body("x" * 254), "metadata.name"),
        (LEASES, {"metadata": {}}, "metadata.name"),
        (LEASES, lease_body(leaseDurationSeconds=0), "spec.leaseDurationSeconds"),
        (LEASES, lease_body(leaseTransitions=-1), "spec.leaseTransitions"),
        (LEASES, lease_body(leaseDurationSeconds=2**31), "spec.leaseDurationSeconds"),
        (LEASES, lease_body(holderIdentity="a\x00b"), "spec.holderIdentity"),
        (COUNTERS, {"metadata": {"name": "c"}, "spec": {"value": 2**63}}, "spec.value"),
        (COUNTERS, {"metadata": {"name": "c"}, "status": {"fencingToken": -1}}, "status.fencingToken"),
        (QUOTAS, {"metadata": {"name": "q"}, "spec": {"hard": {"cpu": -1}}}, "spec.hard.cpu"),
        (QUOTAS, {"metadata": {"name": "q"}, "spec": {"hard": {"cpu": "lots"}}}, "spec.hard[cpu]"),
        (PODS, {"metadata": {"name": "p"}, "status": {"phase": "Dancing"}}, "status.phase"),
    ],
)
def test_values_out_of_range_are_422_invalid_with_the_field_and_why(
    client_with_token: Client, path: str, body: Any, field: str
) -> None:
    status = _status(_send(client_with_token, "post", path, body), 422, "Invalid")
    assert "is invalid" in status["message"] and field in status["message"]
    assert status["details"]["causes"][0]["field"].startswith(field.split("[")[0])
    assert not Change.objects.exists()


def test_a_put_whose_name_differs_from_the_url_is_400(client_with_token: Client) -> None:
    _send(client_with_token, "post", LEASES, lease_body())
    status = _status(_send(client_with_token, "put", f"{LEASES}/demo", lease_body("other")), 400, "BadRequest")
    assert "does not match the name on the URL" in status["message"]


def test_unsupported_media_types_are_415(client_with_token: Client) -> None:
    _send(client_with_token, "post", LEASES, lease_body())
    _status(_send(client_with_token, "post", LEASES, "holder=a", "text/plain"), 415, "UnsupportedMediaType")
    _status(_send(client_with_token, "patch", f"{LEASES}/demo", {}, ""), 415, "UnsupportedMediaType")
    json_patch = [{"op": "replace", "path": "/spec/holderIdentity", "value": "b"}]
    status = _status(
        _send(client_with_token, "patch", f"{LEASES}/demo", json_patch, "application/json-patch+json"),
        415,
        "UnsupportedMediaType",
    )
    assert "application/merge-patch+json" in status["message"]


def test_unknown_methods_and_paths_are_405_and_404_statuses(client_with_token: Client) -> None:
    _status(_send(client_with_token, "post", f"{LEASES}/demo", lease_body()), 405, "MethodNotAllowed")
    _status(client_with_token.delete(LEASES), 405, "MethodNotAllowed")
    _status(client_with_token.get("/apis/nothing.example/v9/things"), 404, "NotFound")
    _status(client_with_token.get("/api/v2"), 404, "NotFound")
    _status(client_with_token.get(f"{LEASES}/missing"), 404, "NotFound")


def test_replace_and_patch_of_a_missing_object_are_404(client_with_token: Client) -> None:
    _status(_send(client_with_token, "put", f"{LEASES}/ghost", lease_body("ghost")), 404, "NotFound")
    _status(
        _send(client_with_token, "patch", f"{LEASES}/ghost", {"spec": {}}, "application/merge-patch+json"),
        404,
        "NotFound",
    )
    _status(client_with_token.delete(f"{LEASES}/ghost"), 404, "NotFound")


def test_bad_query_parameters_are_400(client_with_token: Client) -> None:
    _status(client_with_token.get(LEASES, {"fieldSelector": "spec.holderIdentity=a"}), 400, "BadRequest")
    _status(client_with_token.get(LEASES, {"watch": "1", "resourceVersion": "abc"}), 400, "BadRequest")
    _status(client_with_token.get(LEASES, {"watch": "1", "timeoutSeconds": "-1"}), 400, "BadRequest")
    _status(client_with_token.get(f"{LEASES}/a\x00b"), 400, "BadRequest")


def test_a_bad_if_match_and_a_bad_resource_version_are_400(client_with_token: Client) -> None:
    _send(client_with_token, "post", LEASES, lease_body())
    response = client_with_token.put(
        f"{LEASES}/demo", data=json.dumps(lease_body()), content_type="application/json", headers={"If-Match": '"x"'}
    )
    _status(response, 400, "BadRequest")
    body = lease_body()
    body["metadata"]["resourceVersion"] = "one"
    _status(_send(client_with_token, "put", f"{LEASES}/demo", body), 400, "BadRequest")


def test_kubectl_query_parameters_are_ignored(client_with_token: Client) -> None:
    made = client_with_token.post(
        f"{LEASES}?fieldManager=kubectl-create&fieldValidation=Strict",
        data=json.dumps(lease_body()),
        content_type="application/json",
    )
    assert made.status_code == 201
    listed = client_with_token.get(
        LEASES,
        {"limit": "500"},
        headers={"Accept": KUBECTL_TABLE_ACCEPT},
    )
    assert listed.status_code == 200 and listed.json()["kind"] == "Table"  # the Table kubectl asks for
