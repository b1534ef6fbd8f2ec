"""Dry runs over real HTTP and real kubectl: every check made, what would be stored answered, nothing written.

`dryRun=All` (a query parameter, or a DELETE's DeleteOptions) must leave each row, its
version, the Change log, the quota's `used` and a running job's controls exactly as they
were, while the answer is the object as the write would have stored it, and a write the
real one would refuse (a stale version, a quota with no room, a name taken) is refused alike.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from occviz.jobs.models import Job, JobControl
from occviz.store.models import Change, Lease, Pod, ResourceQuota
from tests.api import tls_fixtures
from tests.api.conftest import JOBS, LEASES, PODS, QUOTAS, lease_body
from tests.api.test_kubectl import Kubectl, kubectl, lease_yaml
from tests.api.test_quota_admission import GPU, exceeded, pod_body, quota_body
from tests.api.test_resources import url

start_tls_server, tls_server = tls_fixtures.start_tls_server, tls_fixtures.tls_server
__all__ = ["kubectl", "start_tls_server", "tls_server"]  # fixtures, found by name

MERGE = {"Content-Type": "application/merge-patch+json"}


def stored() -> dict[str, Any]:
    """Everything a write could leave behind: each object row (with its version), the Change log, the jobs' controls."""
    return {
        "leases": list(Lease.objects.order_by("pk").values()),
        "pods": list(Pod.objects.order_by("pk").values()),
        "quotas": list(ResourceQuota.objects.order_by("pk").values()),
        "changes": list(Change.objects.order_by("pk").values_list("pk", flat=True)),
        "controls": list(JobControl.objects.values_list("pk", flat=True)),
        "jobs": list(Job.objects.values_list("pk", "controls_requested")),
    }


@pytest.fixture
def demo(api: requests.Session) -> dict[str, Any]:
    """A Lease "demo" (holder a), written once more so its version is 2; its JSON."""
    assert api.post(url(api, LEASES), json=lease_body()).status_code == 201
    patched = api.patch(url(api, f"{LEASES}/demo"), data=json.dumps({"spec": {"holderIdentity": "b"}}), headers=MERGE)
    assert patched.status_code == 200 and patched.json()["metadata"]["resourceVersion"] == "2"
    return dict(patched.json())


def _replaced(demo: dict[str, Any]) -> dict[str, Any]:
    body = lease_body(holderIdentity="c")
    body["metadata"]["resourceVersion"] = demo["metadata"]["resourceVersion"]
    return body


# (verb, how it is asked, the holder the answer shows): each as kubectl or a client sends it.
VERBS = {
    "create": lambda api, demo: api.post(url(api, LEASES), params={"dryRun": "All"}, json=lease_body("other")),
    "replace": lambda api, demo: api.put(url(api, f"{LEASES}/demo"), params={"dryRun": "All"}, json=_replaced(demo)),
    "patch": lambda api, demo: api.patch(
        url(api, f"{LEASES}/demo"), params={"dryRun": "All"}, data='{"spec": {"holderIdentity": "c"}}', headers=MERGE
    ),
    "delete": lambda api, demo: api.delete(url(api, f"{LEASES}/demo"), params={"dryRun": "All"}),
    "delete-options": lambda api, demo: api.delete(url(api, f"{LEASES}/demo"), json={"dryRun": ["All"]}),
}
ANSWERED = {"create": (201, "a"), "replace": (200, "c"), "patch": (200, "c"), "delete": (200, "b")}


@pytest.mark.parametrize("verb", list(VERBS))
def test_a_dry_run_answers_what_would_be_stored_and_leaves_everything_as_it_was(
    api: requests.Session, demo: dict[str, Any], verb: str
) -> None:
    before = stored()
    answer = VERBS[verb](api, demo)
    code, holder = ANSWERED[verb.split("-")[0]]
    assert answer.status_code == code, answer.text
    body = answer.json()
    assert (body["kind"], body["spec"]["holderIdentity"]) == ("Lease", holder)
    if verb == "create":
        # As the API server's: what it fills in (uid, creation time), and no version: nothing was stored.
        assert body["metadata"]["name"] == "other" and body["metadata"]["uid"] and body["metadata"]["creationTimestamp"]
        assert "resourceVersion" not in body["metadata"] and "ETag" not in answer.headers
    else:
        # The version the object still has, so that a client may go on to write it for real.
        assert body["metadata"]["resourceVersion"] == "2" and answer.headers["ETag"] == '"2"'
    assert stored() == before
    assert api.get(url(api, f"{LEASES}/demo")).json() == demo


def test_a_dry_run_is_refused_as_the_write_would_be_and_logs_no_refusal(
    api: requests.Session, demo: dict[str, Any]
) -> None:
    before = stored()
    stale = lease_body(holderIdentity="c")
    stale["metadata"]["resourceVersion"] = "1"
    dry, demo_url = {"dryRun": "All"}, url(api, f"{LEASES}/demo")
    assert api.put(demo_url, params=dry, json=stale).status_code == 409
    assert api.put(demo_url, params=dry, json=lease_body(), headers={"If-Match": '"1"'}).status_code == 412
    precondition = {"dryRun": ["All"], "preconditions": {"resourceVersion": "1"}}
    assert api.delete(demo_url, json=precondition).status_code == 409
    assert api.post(url(api, LEASES), params=dry, json=lease_body()).json()["reason"] == "AlreadyExists"
    assert api.post(url(api, LEASES), params=dry, json=lease_body(leaseDurationSeconds=0)).status_code == 422
    assert stored() == before  # a real refusal is logged as a Change; a dry one is not


@pytest.mark.parametrize("value", ["all", "", "None", "All,All"])
def test_any_other_dry_run_value_is_refused_as_the_api_server_refuses_it(
    api: requests.Session, demo: dict[str, Any], value: str
) -> None:
    before = stored()
    answers = {
        "CreateOptions": api.post(url(api, LEASES), params={"dryRun": value}, json=lease_body("other")),
        "UpdateOptions": api.put(url(api, f"{LEASES}/demo"), params={"dryRun": value}, json=lease_body()),
        "PatchOptions": api.patch(url(api, f"{LEASES}/demo"), params={"dryRun": value}, data="{}", headers=MERGE),
        "DeleteOptions": api.delete(url(api, f"{LEASES}/demo"), json={"dryRun": [value]}),
    }
    for options, answer in answers.items():
        assert answer.status_code == 422, (options, answer.text)
        status = answer.json()
        assert status["reason"] == "Invalid"
        assert status["message"] == (
            f'{options}.meta.k8s.io "" is invalid: dryRun: Unsupported value: []string{{{json.dumps(value)}}}: '
            'supported values: "All"'
        )
        assert status["details"]["causes"] == [
            {"reason": "FieldValueNotSupported", "message": status["message"].split("dryRun: ")[1], "field": "dryRun"}
        ]
    assert stored() == before


def test_a_dry_run_pod_is_admitted_or_denied_by_the_quota_and_charges_nothing(api: requests.Session) -> None:
    assert api.post(url(api, QUOTAS), json=quota_body(gpus=2)).status_code == 201
    assert api.post(url(api, PODS), json=pod_body("first")).status_code == 201
    before = stored()
    assert ResourceQuota.objects.get().used == {GPU: 1}

    admitted = api.post(url(api, PODS), params={"dryRun": "All"}, json=pod_body("second"))
    assert admitted.status_code == 201 and admitted.json()["metadata"]["name"] == "second"
    too_many = api.post(url(api, PODS), params={"dryRun": "All"}, json=pod_body("big", gpus=2))
    assert too_many.status_code == 403 and too_many.json()["message"] == (
        exceeded("big", 1, 2).replace(f"requested: {GPU}=1", f"requested: {GPU}=2")
    )
    released = api.delete(url(api, f"{PODS}/first"), params={"dryRun": "All"})
    assert released.status_code == 200 and released.json()["metadata"]["name"] == "first"
    assert stored() == before  # no pod made or gone, `used` still 1 at the same version, no Change

    # The same requests for real do charge and release: the checks above could fail.
    assert api.post(url(api, PODS), json=pod_body("second")).status_code == 201
    assert ResourceQuota.objects.get().used == {GPU: 2}
    assert api.delete(url(api, f"{PODS}/first")).status_code == 200
    assert ResourceQuota.objects.get().used == {GPU: 1}


def test_a_dry_run_on_a_running_jobs_object_is_not_handed_to_the_job(api: requests.Session, student: Any) -> None:
    now = timezone.now()
    job = Job.objects.create(
        scenario="leader-election", params={}, status=Job.Status.RUNNING, started_at=now, heartbeat_at=now
    )
    api.post(url(api, LEASES), json=lease_body())
    Lease.objects.filter(name="demo").update(job=job)
    before = stored()
    patch = '{"spec": {"holderIdentity": "student"}}'
    dry = api.patch(url(api, f"{LEASES}/demo"), params={"dryRun": "All"}, data=patch, headers=MERGE)
    assert dry.status_code == 200 and dry.json()["spec"]["holderIdentity"] == "student"
    assert stored() == before
    # The same patch for real is handed to the job as an outside write: the check above could fail.
    assert api.patch(url(api, f"{LEASES}/demo"), data=patch, headers=MERGE).status_code == 200
    assert JobControl.objects.filter(job=job, action="outside").count() == 1


def test_a_dry_run_job_launch_is_checked_and_launches_nothing(api: requests.Session) -> None:
    launch = {"spec": {"scenario": "counter", "params": {"strategy": "occ", "writers": 2, "increments": 5}}}
    answer = api.post(url(api, JOBS), params={"dryRun": "All"}, json=launch)
    assert answer.status_code == 201, answer.text
    assert (answer.json()["status"]["phase"], answer.json()["spec"]["params"]["writers"]) == ("queued", 2)
    wrong = {"spec": {"scenario": "counter", "params": {"strategy": "occ", "writers": 0}}}
    assert api.post(url(api, JOBS), params={"dryRun": "All"}, json=wrong).status_code == 422
    assert not Job.objects.exists() and not DBTaskResult.objects.exists()  # no job, no task queued
    # Launched for real, the same request makes both: the checks above could fail.
    assert api.post(url(api, JOBS), json=launch).status_code == 201
    assert Job.objects.count() == 1 and DBTaskResult.objects.count() == 1


@pytest.mark.slow
def test_kubectl_server_dry_runs_write_nothing(kubectl: Kubectl, tmp_path: Path) -> None:
    manifest = tmp_path / "lease.yaml"
    manifest.write_text(lease_yaml("alice"))
    made = kubectl.run("create", "-f", str(manifest), "--dry-run=server")
    assert made.stdout == "lease.coordination.k8s.io/demo created (server dry run)\n"
    assert not Lease.objects.filter(name="demo").exists()
    kubectl.run("create", "-f", str(manifest))
    before = stored()

    patched = kubectl.run(
        "patch", "lease", "demo", "--type=merge", "-p", '{"spec":{"holderIdentity":"x"}}', "--dry-run=server", "-o=yaml"
    )
    assert yaml.safe_load(patched.stdout)["spec"]["holderIdentity"] == "x"
    manifest.write_text(lease_yaml("bob", "1"))
    replaced = kubectl.run("replace", "-f", str(manifest), "--dry-run=server", "-o=yaml")
    assert yaml.safe_load(replaced.stdout)["spec"]["holderIdentity"] == "bob"
    deleted = kubectl.run("delete", "lease", "demo", "--dry-run=server")
    assert deleted.stdout == 'lease.coordination.k8s.io "demo" deleted (server dry run)\n'
    assert stored() == before

    shown = yaml.safe_load(kubectl.run("get", "lease", "demo", "-o=yaml").stdout)
    assert (shown["spec"]["holderIdentity"], shown["metadata"]["resourceVersion"]) == ("alice", "1")
