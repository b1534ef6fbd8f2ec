"""The watch page: one object's history (kubectl get -w in the browser), from Changes and the owning job's events."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from occviz.store import writes
from occviz.store.cas import ANY
from occviz.store.models import Counter, Pod, ResourceQuota, VersionConflict
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
    job = run_counter(alice, strategy="occ", writers=3, increments=20, think_ms=1)
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
    assert f"job {job.pk}: writer 2" in page and "committed: value" in page


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
    assert signed_in.get("/watch/deployments/default/x/").status_code == 404
    bad = signed_in.get("/watch/counters/default/x/history.json", {"after_seq": "٣"})
    assert bad.status_code == 400 and "0-9" in bad.json()["error"]


def test_the_page_needs_a_signed_in_user(client: Client, db: None) -> None:
    assert client.get("/watch/counters/default/demo/").status_code == 302
    assert client.get("/watch/counters/default/demo/history.json").status_code == 401
