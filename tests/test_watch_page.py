"""The watch page: one object's history (kubectl get -w in the browser), from Changes and the owning job's events."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from occviz.api import kinds as api_kinds
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.store import kinds as object_kinds
from occviz.store import writes
from occviz.store.cas import ANY
from occviz.store.models import Counter, Deployment, Pod, ResourceQuota, VersionConflict
from tests.helpers import run_counter

pytestmark = pytest.mark.django_db

ALICE = writes.Writer("api", "alice (token laptop)")
BOB = writes.Writer("admin", "bob")


def _counter() -> Counter:
    return writes.create(Counter, {"namespace": "default", "name": "demo", "value": 0}, ALICE)


def test_the_page_shows_every_version_its_writer_and_the_conflicts(signed_in: Client) -> None:
    counter = _counter()
    counter = writes.update(counter, {"value": 1}, ALICE, expected_version=1)
    writes.update(counter, {"value": 7}, BOB, expected_version=ANY)
    with pytest.raises(VersionConflict):
        writes.update(counter, {"value": 2}, ALICE, expected_version=2)

    page = signed_in.get("/watch/counters/default/demo/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "/apis/occviz.dev/v1/namespaces/default/counters/demo" in html
    assert "v3" in html and "blind write (no resourceVersion): value 7" in html
    assert "409 Conflict: had v2, stored v3" in html
    assert "API: alice (token laptop)" in html and "admin: bob" in html

    data = signed_in.get("/watch/counters/default/demo/history.json").json()
    assert data["object"]["version"] == 3
    # Newest first: the refusal against v3 came after v3 was written.
    assert [(e["version"], e["type"]) for e in data["entries"]] == [
        (3, "CONFLICT"),
        (3, "MODIFIED"),
        (2, "MODIFIED"),
        (1, "ADDED"),
    ]
    assert data["counts"] == {
        "API: alice (token laptop)": {"versions": 2, "conflicts": 1},
        "admin: bob": {"versions": 1, "conflicts": 0},
    }
    # Polling from the cursors gives only what is new.
    again = signed_in.get(
        "/watch/counters/default/demo/history.json",
        {"after_change": data["after_change"], "after_seq": data["after_seq"]},
    ).json()
    assert again["entries"] == [] and again["counts"] == {}


@pytest.mark.django_db(transaction=True)
def test_a_jobs_row_shows_its_writers_versions_from_the_jobs_events(signed_in: Client, alice: Any) -> None:
    # Attempts enough that no writer gives an increment up (four conflicts in a row can happen on a busy machine).
    job = run_counter(alice, strategy="occ", writers=3, increments=20, think_ms=1, max_attempts=50)
    row = Counter.objects.get(job=job)
    writes.update(row, {"value": row.value + 1}, ALICE, expected_version=row.resource_version)

    detail = signed_in.get(f"/jobs/{job.pk}/").content.decode()
    assert f'href="/watch/counters/job-{job.pk}/row-1/"' in detail

    data = signed_in.get(f"/watch/counters/job-{job.pk}/row-1/history.json").json()
    counts = data["counts"]
    written = {writer: tally["versions"] for writer, tally in counts.items()}
    assert written == {f"job {job.pk}: writer {n}": 20 for n in (1, 2, 3)} | {"API: alice (token laptop)": 1}
    assert sum(tally["conflicts"] for tally in counts.values()) == job.summary["conflicts"]
    assert data["entries"][0]["version"] == 62 and data["entries"][0]["writer"] == "API: alice (token laptop)"
    assert len(data["entries"]) == 50
    page = signed_in.get(f"/watch/counters/job-{job.pk}/row-1/").content.decode()
    # Each write worded as the scenario words it on the job page.
    assert f"job {job.pk}: writer 2" in page and "writer 2 committed v" in page


@pytest.mark.django_db(transaction=True)
def test_a_controller_race_links_its_deployment_whose_page_shows_every_version_and_conflict(
    signed_in: Client, alice: Any
) -> None:
    job = run_job(
        create_job(
            "controllers", {"strategy": "occ", "controllers": 3, "rate_per_s": 100, "seconds": 1, "think_ms": 5}
        ).pk
    )
    deployment = Deployment.objects.get(job=job)
    watch_url = f"/watch/deployments/job-{job.pk}/{deployment.name}/"
    assert f'href="{watch_url}"' in signed_in.get(f"/jobs/{job.pk}/").content.decode()

    page = signed_in.get(watch_url)
    assert page.status_code == 200
    assert f"/apis/apps/v1/namespaces/job-{job.pk}/deployments/{deployment.name}" in page.content.decode()
    counts = signed_in.get(f"{watch_url}history.json").json()["counts"]
    # Every version after the first is one of the controllers' writes; each conflict is counted once.
    assert sum(tally["versions"] for tally in counts.values()) == deployment.resource_version - 1
    assert sum(tally["conflicts"] for tally in counts.values()) == job.summary["conflicts"] > 0


@pytest.mark.django_db(transaction=True)
def test_a_quota_race_links_its_quota_whose_history_shows_every_charge(signed_in: Client, alice: Any) -> None:
    job = run_job(create_job("quota", {"pods": 12, "hard": 10, "request": 1, "workers": 4, "think_ms": 2}).pk)
    quota = ResourceQuota.objects.get(job=job)
    watch_url = f"/watch/resourcequotas/job-{job.pk}/{quota.name}/"
    detail = signed_in.get(f"/jobs/{job.pk}/").content.decode()
    # Linked before its pods, however many there are; and a pod too.
    assert f'href="{watch_url}"' in detail and f'href="/watch/pods/job-{job.pk}/' in detail

    data = signed_in.get(f"{watch_url}history.json").json()
    counts = data["counts"]
    assert sum(tally["versions"] for tally in counts.values()) == quota.resource_version - 1 > 0
    conflicts = job.summary["admission_conflicts"] + job.summary["resync_conflicts"]
    assert sum(tally["conflicts"] for tally in counts.values()) == conflicts
    assert any("admitted pod-" in entry["what"] for entry in data["entries"])
    assert "Nothing yet." not in signed_in.get(watch_url).content.decode()


def test_every_kind_the_api_serves_has_a_watch_page(signed_in: Client) -> None:
    assert [kind.object_kind for kind in api_kinds.KINDS] == list(object_kinds.KINDS)
    for kind in object_kinds.KINDS:
        fields = dict(kind.demo[0])
        obj = writes.create(kind.model, {"namespace": "default", **fields}, ALICE)
        page = signed_in.get(f"/watch/{kind.plural}/default/{obj.name}/")
        assert page.status_code == 200, kind.plural
        assert kind.object_path("default", obj.name) in page.content.decode()


def test_nested_fields_read_as_kubectl_prints_them(signed_in: Client) -> None:
    gpu = "requests.nvidia.com/gpu"
    quota = writes.create(
        ResourceQuota, {"namespace": "class", "name": "gpu-quota", "hard": {gpu: 3}, "used": {gpu: 0}}, ALICE
    )
    writes.update(quota, {"used": {gpu: 1}}, BOB, expected_version=1)
    writes.create(Pod, {"namespace": "class", "name": "pod-1", "requests": {gpu: 1}, "phase": "Running"}, ALICE)

    data = signed_in.get("/watch/resourcequotas/class/gpu-quota/history.json").json()
    assert f"hard:\n  {gpu}: 3\nused:\n  {gpu}: 1" in data["object"]["text"]
    page = signed_in.get("/watch/resourcequotas/class/gpu-quota/").content.decode()
    assert f"hard:\n  {gpu}: 3\nused:\n  {gpu}: 1" in page
    pod = signed_in.get("/watch/pods/class/pod-1/").content.decode()
    assert f"requests:\n  {gpu}: 1\nphase: Running" in pod
    assert "{&#x27;" not in page.split("data-fields>")[1].split("</pre>")[0]  # no Python dict written out


def test_unknown_resources_and_bad_cursors_are_refused(signed_in: Client, client: Client) -> None:
    assert signed_in.get("/watch/widgets/default/x/").status_code == 404
    bad = signed_in.get("/watch/counters/default/x/history.json", {"after_seq": "٣"})
    assert bad.status_code == 400 and "0-9" in bad.json()["error"]


def test_the_page_needs_a_signed_in_user(client: Client, db: None) -> None:
    assert client.get("/watch/counters/default/demo/").status_code == 302
    assert client.get("/watch/counters/default/demo/history.json").status_code == 401
