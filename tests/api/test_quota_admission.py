"""Quota admission of pods created over real HTTP: exactly `hard` admitted among racing creates, the API server's 403.

Creates are sent at once from threads released by one barrier, each on its own HTTP
connection, against a live Daphne; every charge is a compare-and-swap of the quota row.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from typing import Any

import requests

from occviz.store.models import Change, Pod, ResourceQuota
from tests.api.conftest import PODS, QUOTAS
from tests.api.test_resources import url

GPU = "requests.nvidia.com/gpu"


def quota_body(name: str = "gpu-quota", gpus: int = 1) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name}, "spec": {"hard": {GPU: gpus}}}


def pod_body(name: str, gpus: int | str = 1) -> dict[str, Any]:
    resources = {"requests": {"nvidia.com/gpu": gpus}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "cuda", "resources": resources}]},
    }


def exceeded(pod: str, used: int, hard: int, quota: str = "gpu-quota") -> str:
    return (
        f'pods "{pod}" is forbidden: exceeded quota: {quota}, requested: {GPU}=1, used: {GPU}={used}, '
        f"limited: {GPU}={hard}"
    )


def create_at_once(api: requests.Session, names: list[str]) -> dict[str, requests.Response]:
    """POST a pod for each name, all released together by one barrier, each on its own connection."""
    barrier = threading.Barrier(len(names))
    responses: dict[str, requests.Response] = {}

    def create(name: str) -> None:
        with requests.Session() as session:
            session.headers["Authorization"] = api.headers["Authorization"]
            session.get(url(api, "/version"))  # connected before the barrier: connecting is not the race
            barrier.wait()
            responses[name] = session.post(url(api, PODS), json=pod_body(name))

    threads = [threading.Thread(target=create, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return responses


def used(name: str = "gpu-quota") -> Any:
    return ResourceQuota.objects.get(namespace="default", name=name).used


def test_two_pods_racing_for_one_gpu_one_is_created_one_is_forbidden(api: requests.Session) -> None:
    assert api.post(url(api, QUOTAS), json=quota_body()).status_code == 201
    responses = create_at_once(api, ["pod-a", "pod-b"])

    codes = sorted(response.status_code for response in responses.values())
    assert codes == [201, 403], {name: r.text for name, r in responses.items()}
    (loser,) = [name for name, response in responses.items() if response.status_code == 403]
    assert responses[loser].json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": exceeded(loser, used=1, hard=1),
        "reason": "Forbidden",
        "details": {"name": loser, "kind": "pods"},
        "code": 403,
    }
    assert used() == {GPU: 1}
    assert list(Pod.objects.values_list("name", flat=True)) == [name for name in responses if name != loser]
    quota = api.get(url(api, f"{QUOTAS}/gpu-quota")).json()
    assert quota["status"]["used"] == {GPU: "1"}
    # The charge is a write of the quota by the API's caller, in its history.
    charge = Change.objects.get(resource="resourcequotas", type="MODIFIED")
    assert (charge.via, charge.writer, charge.expected_version) == ("api", "student (token laptop)", 1)


def test_twenty_creates_for_five_gpus_admit_exactly_five(api: requests.Session) -> None:
    api.post(url(api, QUOTAS), json=quota_body(gpus=5))
    responses = create_at_once(api, [f"pod-{n}" for n in range(20)])

    codes = Tally(response.status_code for response in responses.values())
    assert codes[201] == 5, {name: r.text for name, r in responses.items()}
    # The rest are denied: over quota, or (rarely) the quota's write conflicted past the 3 retries.
    assert codes[403] + codes[409] == 15
    for response in responses.values():
        if response.status_code == 403:
            assert response.json()["message"].endswith(f"used: {GPU}=5, limited: {GPU}=5")
        elif response.status_code == 409:
            assert response.json()["message"].startswith('Operation cannot be fulfilled on resourcequotas "gpu-quota"')
    assert used() == {GPU: 5} and Pod.objects.count() == 5
    # Every charge landed on its own version: five writes, none lost.
    assert ResourceQuota.objects.get(name="gpu-quota").resource_version == 1 + 5


def test_a_deleted_pod_frees_its_charge(api: requests.Session) -> None:
    api.post(url(api, QUOTAS), json=quota_body())
    assert api.post(url(api, PODS), json=pod_body("first")).status_code == 201
    refused = api.post(url(api, PODS), json=pod_body("second"))
    assert refused.status_code == 403 and refused.json()["message"] == exceeded("second", used=1, hard=1)
    assert not Pod.objects.filter(name="second").exists(), "a denied pod is not stored"

    assert api.delete(url(api, f"{PODS}/first")).status_code == 200
    assert used() == {GPU: 0}
    assert api.post(url(api, PODS), json=pod_body("second")).status_code == 201
    assert used() == {GPU: 1}
    release = Change.objects.filter(resource="resourcequotas", type="MODIFIED").order_by("id")[1]
    assert (release.object["used"], release.writer) == ({GPU: 0}, "student (token laptop)")


def test_a_pod_is_charged_to_every_quota_that_names_its_requests(api: requests.Session) -> None:
    api.post(url(api, QUOTAS), json=quota_body("team", gpus=4))
    api.post(url(api, QUOTAS), json=quota_body("tight", gpus=1))
    other = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "cpu"}, "spec": {"hard": {"cpu": 8}}}
    api.post(url(api, QUOTAS), json=other)

    assert api.post(url(api, PODS), json=pod_body("one")).status_code == 201
    assert (used("team"), used("tight"), used("cpu")) == ({GPU: 1}, {GPU: 1}, {"cpu": 0})
    refused = api.post(url(api, PODS), json=pod_body("two"))
    assert refused.status_code == 403
    assert refused.json()["message"] == exceeded("two", used=1, hard=1, quota="tight")
    # The quota that had room was charged first, and given back when the other refused.
    assert used("team") == {GPU: 1}


def test_a_name_taken_charges_nothing_and_requests_cannot_change(api: requests.Session) -> None:
    api.post(url(api, QUOTAS), json=quota_body(gpus=3))
    assert api.post(url(api, PODS), json=pod_body("p")).status_code == 201
    again = api.post(url(api, PODS), json=pod_body("p"))
    assert again.status_code == 409 and again.json()["reason"] == "AlreadyExists"
    assert used() == {GPU: 1}

    pod = api.get(url(api, f"{PODS}/p")).json()
    pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "3"
    changed = api.put(url(api, f"{PODS}/p"), json=pod)
    assert changed.status_code == 422 and "pod updates may not change resource requests" in changed.json()["message"]
    assert used() == {GPU: 1} and Pod.objects.get(name="p").requests == {GPU: 1}


def test_pods_in_a_namespace_without_quota_are_not_charged(api: requests.Session) -> None:
    created = api.post(url(api, PODS), json=pod_body("free", gpus=50))
    assert created.status_code == 201
    assert not Change.objects.filter(resource="resourcequotas").exists()
