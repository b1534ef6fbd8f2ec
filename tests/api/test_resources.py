"""The served kinds over real HTTP against a live Daphne: get, list, create, replace, patch, delete, conflicts."""

from __future__ import annotations

import json

import requests

from occviz.store.models import Change, Counter, Lease
from tests.api.conftest import COUNTERS, LEASES, PODS, QUOTAS, lease_body

CONFLICT_MESSAGE = (
    'Operation cannot be fulfilled on leases.coordination.k8s.io "demo": the object has been modified; '
    "please apply your changes to the latest version and try again"
)


def url(api: requests.Session, path: str) -> str:
    return api.base + path  # type: ignore[attr-defined,no-any-return]


def test_create_get_and_list_a_lease_as_kubernetes_json(api: requests.Session) -> None:
    created = api.post(url(api, LEASES), json=lease_body(renewTime="2026-11-22T10:00:00.123456Z"))
    assert created.status_code == 201, created.text
    lease = created.json()
    assert lease["apiVersion"] == "coordination.k8s.io/v1" and lease["kind"] == "Lease"
    meta = lease["metadata"]
    assert (meta["name"], meta["namespace"], meta["resourceVersion"]) == ("demo", "default", "1")
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert lease["spec"] == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "renewTime": "2026-11-22T10:00:00.123456Z",
        "leaseTransitions": 0,
    }
    assert created.headers["ETag"] == '"1"'

    got = api.get(url(api, f"{LEASES}/demo"))
    assert got.status_code == 200 and got.json() == lease and got.headers["Content-Type"] == "application/json"
    listed = api.get(url(api, LEASES), params={"limit": 500})
    assert listed.json()["kind"] == "LeaseList" and [i["metadata"]["name"] for i in listed.json()["items"]] == ["demo"]
    assert listed.json()["metadata"]["resourceVersion"] == "1"
    everywhere = api.get(url(api, "/apis/coordination.k8s.io/v1/leases"))
    assert [i["metadata"]["name"] for i in everywhere.json()["items"]] == ["demo"]
    change = Change.objects.get(type="ADDED")
    assert change.via == "api" and change.writer == "student (token laptop)"


def test_a_stale_put_is_409_with_the_api_servers_status_and_writes_nothing(api: requests.Session) -> None:
    api.post(url(api, LEASES), json=lease_body())
    first = api.get(url(api, f"{LEASES}/demo")).json()
    first["spec"]["holderIdentity"] = "b"
    assert api.put(url(api, f"{LEASES}/demo"), json=first).json()["metadata"]["resourceVersion"] == "2"
    first["spec"]["holderIdentity"] = "c"  # still carries resourceVersion 1
    stale = api.put(url(api, f"{LEASES}/demo"), json=first)
    assert stale.status_code == 409
    assert stale.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": CONFLICT_MESSAGE,
        "reason": "Conflict",
        "details": {"name": "demo", "group": "coordination.k8s.io", "kind": "leases"},
        "code": 409,
    }
    lease = Lease.objects.get(name="demo")
    assert (lease.holder_identity, lease.resource_version) == ("b", 2)
    conflict = Change.objects.get(type="CONFLICT")
    assert (conflict.expected_version, conflict.resource_version) == (1, 2)


def test_a_put_without_a_resource_version_is_a_blind_write(api: requests.Session) -> None:
    api.post(url(api, LEASES), json=lease_body())
    blind = api.put(url(api, f"{LEASES}/demo"), json=lease_body(holderIdentity="z"))
    assert blind.status_code == 200 and blind.json()["metadata"]["resourceVersion"] == "2"
    change = Change.objects.get(type="MODIFIED")
    assert change.blind


def test_a_stale_if_match_is_412_and_a_current_one_writes(api: requests.Session) -> None:
    api.post(url(api, LEASES), json=lease_body())
    api.put(url(api, f"{LEASES}/demo"), json=lease_body(holderIdentity="b"))
    stale = api.put(url(api, f"{LEASES}/demo"), json=lease_body(holderIdentity="c"), headers={"If-Match": '"1"'})
    assert stale.status_code == 412 and stale.json()["kind"] == "Status" and stale.json()["code"] == 412
    current = api.put(url(api, f"{LEASES}/demo"), json=lease_body(holderIdentity="c"), headers={"If-Match": '"2"'})
    assert current.status_code == 200 and current.headers["ETag"] == '"3"'
    patched = api.patch(
        url(api, f"{LEASES}/demo"),
        json={"spec": {"holderIdentity": "d"}},
        headers={"Content-Type": "application/merge-patch+json", "If-Match": '"2"'},
    )
    assert patched.status_code == 412


def test_merge_patch_applies_to_the_current_object_and_checks_a_given_version(api: requests.Session) -> None:
    api.post(url(api, COUNTERS), json={"metadata": {"name": "hot"}, "spec": {"value": 5}})
    merge = {"Content-Type": "application/merge-patch+json"}
    patched = api.patch(url(api, f"{COUNTERS}/hot"), json={"spec": {"value": 6}}, headers=merge)
    assert patched.status_code == 200, patched.text
    assert patched.json()["spec"] == {"value": 6} and patched.json()["status"] == {"fencingToken": 0}
    strategic = {"Content-Type": "application/strategic-merge-patch+json"}
    also = api.patch(url(api, f"{COUNTERS}/hot"), json={"status": {"fencingToken": 3}}, headers=strategic)
    assert also.json()["status"] == {"fencingToken": 3} and also.json()["spec"] == {"value": 6}
    stale = api.patch(
        url(api, f"{COUNTERS}/hot"), json={"metadata": {"resourceVersion": "1"}, "spec": {"value": 0}}, headers=merge
    )
    assert stale.status_code == 409 and stale.json()["details"]["group"] == "occviz.dev"
    assert Counter.objects.get(name="hot").value == 6


def test_delete_with_a_stale_precondition_is_409_and_with_none_deletes(api: requests.Session) -> None:
    api.post(url(api, LEASES), json=lease_body())
    api.put(url(api, f"{LEASES}/demo"), json=lease_body(holderIdentity="b"))
    stale = api.delete(url(api, f"{LEASES}/demo"), json={"preconditions": {"resourceVersion": "1"}})
    assert stale.status_code == 409 and stale.json()["message"] == CONFLICT_MESSAGE
    deleted = api.delete(url(api, f"{LEASES}/demo"), json={"preconditions": {"resourceVersion": "2"}})
    assert deleted.status_code == 200 and deleted.json()["metadata"]["name"] == "demo"
    gone = api.get(url(api, f"{LEASES}/demo"))
    assert gone.status_code == 404
    assert gone.json()["message"] == 'leases.coordination.k8s.io "demo" not found'
    assert gone.json()["reason"] == "NotFound"


def test_create_of_an_existing_name_is_409_already_exists(api: requests.Session) -> None:
    assert api.post(url(api, LEASES), json=lease_body()).status_code == 201
    again = api.post(url(api, LEASES), json=lease_body())
    assert again.status_code == 409
    assert again.json()["reason"] == "AlreadyExists"
    assert again.json()["message"] == 'leases.coordination.k8s.io "demo" already exists'


def test_pods_and_quotas_map_requests_hard_and_used(api: requests.Session) -> None:
    quota = {"metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "2"}}}
    created = api.post(url(api, QUOTAS), json=quota)
    assert created.status_code == 201, created.text
    assert created.json()["kind"] == "ResourceQuota"
    assert created.json()["status"] == {
        "hard": {"requests.nvidia.com/gpu": "2"},
        "used": {"requests.nvidia.com/gpu": "0"},
    }
    pod = {
        "metadata": {"name": "trainer"},
        "spec": {
            "containers": [
                {"name": "a", "image": "x", "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "500m"}}},
                {"name": "b", "image": "y", "resources": {"requests": {"nvidia.com/gpu": 1}}},
            ]
        },
    }
    made = api.post(url(api, PODS), json=pod)
    assert made.status_code == 201, made.text
    assert made.json()["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "2", "cpu": "500m"}
    assert made.json()["status"] == {"phase": "Pending"}
    charged = api.get(url(api, f"{QUOTAS}/gpus")).json()["status"]["used"]
    assert charged == {"requests.nvidia.com/gpu": "2"}, "admission charged the quota"
    everywhere = api.get(url(api, "/api/v1/pods"))
    assert everywhere.json()["kind"] == "PodList" and len(everywhere.json()["items"]) == 1


def test_a_create_without_a_content_type_is_json_as_the_python_client_sends_it(api: requests.Session) -> None:
    request = requests.Request("POST", url(api, LEASES), data=json.dumps(lease_body()), headers=dict(api.headers))
    prepared = api.prepare_request(request)
    prepared.headers.pop("Content-Type", None)
    made = api.send(prepared)
    assert made.status_code == 201, made.text
