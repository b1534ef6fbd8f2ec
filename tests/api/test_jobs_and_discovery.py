"""Jobs under occviz.dev and discovery, over real HTTP against Daphne and a db_worker."""

from __future__ import annotations

import json
import time

import requests
from django.contrib.auth.models import User

from occviz.api.models import ApiToken
from occviz.jobs.models import Job
from tests.api.conftest import JOBS
from tests.api.test_resources import url


def _wait_for(api: requests.Session, name: str, statuses: tuple[str, ...], timeout: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = api.get(url(api, f"{JOBS}/{name}")).json()
        if job["status"]["phase"] in statuses:
            return dict(job)
        time.sleep(0.2)
    raise AssertionError(f"job {name} never reached {statuses}")


def test_a_job_launched_through_the_api_runs_and_its_events_page_as_json_lines(api: requests.Session) -> None:
    launched = api.post(
        url(api, JOBS),
        json={"spec": {"scenario": "counter", "params": {"strategy": "occ", "writers": 2, "increments": 5}}},
    )
    assert launched.status_code == 201, launched.text
    job = launched.json()
    assert job["kind"] == "Job" and job["spec"]["params"]["writers"] == 2
    name = job["metadata"]["name"]
    done = _wait_for(api, name, ("succeeded", "failed"))
    assert done["status"]["phase"] == "succeeded", done  # type: ignore[index]
    events = api.get(url(api, f"{JOBS}/{name}/events"), params={"after": 0, "limit": 5})
    assert events.status_code == 200 and events.headers["X-Occviz-More"] == "true"
    lines = [json.loads(line) for line in events.text.splitlines()]
    assert [event["seq"] for event in lines] == [1, 2, 3, 4, 5]
    rest = api.get(url(api, f"{JOBS}/{name}/events"), params={"after": 5}).text.splitlines()
    assert json.loads(rest[0])["seq"] == 6
    listed = api.get(url(api, JOBS)).json()
    assert listed["kind"] == "JobList" and [item["metadata"]["name"] for item in listed["items"]] == [name]


def test_a_job_is_cancelled_by_a_delete_or_a_post_to_cancel(api: requests.Session) -> None:
    spec = {"scenario": "counter", "params": {"strategy": "occ", "writers": 1, "seconds": 60}}
    first = api.post(url(api, JOBS), json={"spec": spec}).json()["metadata"]["name"]
    _wait_for(api, first, ("running",))
    cancelled = api.delete(url(api, f"{JOBS}/{first}"))
    assert cancelled.status_code == 200 and cancelled.json()["status"]["cancelRequested"] is True
    assert _wait_for(api, first, ("cancelled",))["status"]["phase"] == "cancelled"  # type: ignore[index]
    second = api.post(url(api, JOBS), json={"spec": spec}).json()["metadata"]["name"]
    assert api.post(url(api, f"{JOBS}/{second}/cancel")).status_code == 200
    assert _wait_for(api, second, ("cancelled",))["status"]["phase"] == "cancelled"  # type: ignore[index]


def test_launches_are_validated_as_the_form_validates_them(api: requests.Session) -> None:
    unknown = api.post(url(api, JOBS), json={"spec": {"scenario": "nope"}})
    assert unknown.status_code == 422 and "spec.scenario" in unknown.json()["message"]
    bad = api.post(url(api, JOBS), json={"spec": {"scenario": "counter", "params": {"strategy": "occ", "writers": 0}}})
    assert bad.status_code == 422 and bad.json()["details"]["causes"][0]["field"] == "spec.params.writers"
    wrong_type = api.post(url(api, JOBS), json={"spec": {"scenario": 3}})
    assert wrong_type.status_code == 400
    assert api.get(url(api, f"{JOBS}/999999")).status_code == 404
    assert not Job.objects.exists()


def test_a_launch_over_the_per_person_limit_is_refused_with_a_status(api: requests.Session, settings: object) -> None:
    spec = {"scenario": "counter", "params": {"strategy": "occ", "writers": 1, "seconds": 60}}
    names = []
    for _ in range(10):
        response = api.post(url(api, JOBS), json={"spec": spec})
        if response.status_code != 201:
            break
        names.append(response.json()["metadata"]["name"])
    assert response.status_code == 403 and response.json()["reason"] == "Forbidden"
    assert "the job was not launched" in response.json()["message"]
    for name in names:
        api.delete(url(api, f"{JOBS}/{name}"))


def test_only_the_launcher_or_staff_may_cancel_a_job(api: requests.Session, student: User) -> None:
    spec = {"scenario": "counter", "params": {"strategy": "occ", "writers": 1, "seconds": 60}}
    name = api.post(url(api, JOBS), json={"spec": spec}).json()["metadata"]["name"]
    other = User.objects.create_user("other")
    headers = {"Authorization": f"Bearer {ApiToken.issue(other, 'x')[1]}"}
    refused = requests.delete(url(api, f"{JOBS}/{name}"), headers=headers)
    assert refused.status_code == 403
    api.delete(url(api, f"{JOBS}/{name}"))


def test_discovery_serves_what_kubectl_reads(api_url: str) -> None:
    assert requests.get(api_url + "/version").json()["gitVersion"] == "v1.32.0-occviz"
    assert requests.get(api_url + "/api").json()["versions"] == ["v1"]
    core = requests.get(api_url + "/api/v1").json()
    assert core["kind"] == "APIResourceList"
    pods = next(r for r in core["resources"] if r["name"] == "pods")
    assert pods["namespaced"] and pods["kind"] == "Pod" and "watch" in pods["verbs"] and pods["shortNames"] == ["po"]
    assert next(r for r in core["resources"] if r["name"] == "resourcequotas")["shortNames"] == ["quota"]
    groups = requests.get(
        api_url + "/apis",
        headers={"Accept": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"},
    )
    assert groups.headers["Content-Type"] == "application/json"
    assert [g["preferredVersion"]["groupVersion"] for g in groups.json()["groups"]] == [
        "apps/v1",
        "coordination.k8s.io/v1",
        "occviz.dev/v1",
    ]
    assert requests.get(api_url + "/apis/coordination.k8s.io").json()["kind"] == "APIGroup"
    leases = requests.get(api_url + "/apis/coordination.k8s.io/v1").json()["resources"]
    assert [r["name"] for r in leases] == ["leases"]
    own = [r["name"] for r in requests.get(api_url + "/apis/occviz.dev/v1").json()["resources"]]
    assert own == ["counters", "jobs"]
    assert requests.get(api_url + "/apis/nothing.example").status_code == 404


def test_namespaces_are_those_in_use_and_default(api: requests.Session) -> None:
    api.post(url(api, "/apis/occviz.dev/v1/namespaces/class-a/counters"), json={"metadata": {"name": "c"}})
    names = [item["metadata"]["name"] for item in api.get(url(api, "/api/v1/namespaces")).json()["items"]]
    assert names == ["class-a", "default"]
    assert api.get(url(api, "/api/v1/namespaces/default")).json()["kind"] == "Namespace"
    assert api.get(url(api, "/api/v1/namespaces/nowhere")).status_code == 404
