"""apps/v1 Deployments over real HTTP: discovery, the OpenAPI documents, every verb as the API server serves it."""

from __future__ import annotations

from typing import Any

import requests

from occviz.store.models import Change, Deployment
from tests.api.test_resources import url
from tests.api.test_watch import Watch

DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
STALE = (
    'Operation cannot be fulfilled on deployments.apps "web": the object has been modified; '
    "please apply your changes to the latest version and try again"
)


def deployment_body(name: str = "web", replicas: int = 3, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name, **labels}, "annotations": {"team": "blue"}},
        "spec": {
            "replicas": replicas,
            # What a real manifest carries besides: accepted and not stored, as unknown fields are.
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "web"}]}},
        },
    }


def test_discovery_and_openapi_serve_apps_v1(api: requests.Session) -> None:
    groups = api.get(url(api, "/apis")).json()["groups"]
    assert {"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}]}.items() <= next(
        group for group in groups if group["name"] == "apps"
    ).items()
    resources = api.get(url(api, "/apis/apps/v1")).json()
    assert resources["groupVersion"] == "apps/v1"
    (deployments,) = resources["resources"]
    assert (deployments["name"], deployments["kind"], deployments["shortNames"]) == (
        "deployments",
        "Deployment",
        ["deploy"],
    )
    assert "watch" in deployments["verbs"] and "patch" in deployments["verbs"]

    index = api.get(url(api, "/openapi/v3")).json()["paths"]
    assert index["apis/apps/v1"] == {"serverRelativeURL": "/openapi/v3/apis/apps/v1"}
    document = api.get(url(api, "/openapi/v3/apis/apps/v1")).json()
    item = document["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]
    assert item["patch"]["x-kubernetes-group-version-kind"] == {"group": "apps", "version": "v1", "kind": "Deployment"}
    assert "Deployment" in document["components"]["schemas"]


def test_create_get_list_as_kubernetes_json(api: requests.Session) -> None:
    created = api.post(url(api, DEPLOYMENTS), json=deployment_body())
    assert created.status_code == 201, created.text
    body = created.json()
    assert (body["apiVersion"], body["kind"]) == ("apps/v1", "Deployment")
    meta = body["metadata"]
    assert (meta["name"], meta["namespace"], meta["resourceVersion"]) == ("web", "default", "1")
    assert meta["labels"] == {"app": "web"} and meta["annotations"] == {"team": "blue"}
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert body["spec"] == {"replicas": 3} and body["status"] == {}
    stored = Deployment.objects.get(name="web")
    assert (stored.replicas, stored.labels, stored.annotations) == (3, {"app": "web"}, {"team": "blue"})

    assert api.get(url(api, f"{DEPLOYMENTS}/web")).json() == body
    listed = api.get(url(api, DEPLOYMENTS)).json()
    assert listed["kind"] == "DeploymentList" and [i["metadata"]["name"] for i in listed["items"]] == ["web"]
    everywhere = api.get(url(api, "/apis/apps/v1/deployments")).json()
    assert [i["metadata"]["name"] for i in everywhere["items"]] == ["web"]
    missing = api.get(url(api, f"{DEPLOYMENTS}/nope"))
    assert missing.status_code == 404 and missing.json()["message"] == 'deployments.apps "nope" not found'


def test_replace_fresh_then_stale_is_409_with_the_api_servers_message(api: requests.Session) -> None:
    api.post(url(api, DEPLOYMENTS), json=deployment_body())
    first = api.get(url(api, f"{DEPLOYMENTS}/web")).json()
    first["spec"]["replicas"] = 5
    first["metadata"]["labels"]["tier"] = "front"
    replaced = api.put(url(api, f"{DEPLOYMENTS}/web"), json=first)
    assert replaced.status_code == 200 and replaced.json()["metadata"]["resourceVersion"] == "2"
    assert replaced.json()["metadata"]["labels"] == {"app": "web", "tier": "front"}

    first["spec"]["replicas"] = 9  # still carries resourceVersion 1
    stale = api.put(url(api, f"{DEPLOYMENTS}/web"), json=first)
    assert stale.status_code == 409
    assert stale.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": STALE,
        "reason": "Conflict",
        "details": {"name": "web", "group": "apps", "kind": "deployments"},
        "code": 409,
    }
    stored = Deployment.objects.get(name="web")
    assert (stored.replicas, stored.resource_version) == (5, 2)
    conflict = Change.objects.get(resource="deployments", type="CONFLICT")
    assert (conflict.expected_version, conflict.resource_version) == (1, 2)


def test_status_is_kept_by_a_replace_without_it_and_set_by_one_with_it(api: requests.Session) -> None:
    body = deployment_body()
    body["status"] = {"observedGeneration": 4, "availableReplicas": 2}
    created = api.post(url(api, DEPLOYMENTS), json=body).json()
    assert created["status"] == {"observedGeneration": 4, "availableReplicas": 2}
    again = deployment_body(replicas=1)
    kept = api.put(url(api, f"{DEPLOYMENTS}/web"), json=again).json()
    assert kept["status"] == {"observedGeneration": 4, "availableReplicas": 2} and kept["spec"] == {"replicas": 1}
    bad = api.put(url(api, f"{DEPLOYMENTS}/web"), json=deployment_body(replicas=-1))
    assert bad.status_code == 422 and bad.json()["message"].startswith(
        'Deployment.apps "web" is invalid: spec.replicas'
    )


def test_merge_patch_delete_and_watch(api: requests.Session) -> None:
    watch = Watch(api, DEPLOYMENTS)
    try:
        api.post(url(api, DEPLOYMENTS), json=deployment_body())
        added = watch.next()
        assert (added["type"], added["object"]["kind"]) == ("ADDED", "Deployment")

        patched = api.patch(
            url(api, f"{DEPLOYMENTS}/web"),
            json={"metadata": {"labels": {"tier": "front"}, "annotations": {"team": None}}, "spec": {"replicas": 7}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert patched.status_code == 200, patched.text
        meta = patched.json()["metadata"]
        assert meta["labels"] == {"app": "web", "tier": "front"} and "annotations" not in meta
        assert patched.json()["spec"] == {"replicas": 7}
        modified = watch.next()
        assert modified["type"] == "MODIFIED" and modified["object"]["spec"]["replicas"] == 7

        deleted = api.delete(url(api, f"{DEPLOYMENTS}/web"))
        assert deleted.status_code == 200 and not Deployment.objects.exists()
        assert watch.next()["type"] == "DELETED"
    finally:
        watch.close()
