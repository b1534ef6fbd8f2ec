"""A job made of jobs (occviz.jobs.children): each part a whole job, linked, stopped with its parent."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from django.db import connections

from occviz.jobs.children import run_child
from occviz.jobs.context import JobContext
from occviz.jobs.models import Job
from occviz.jobs.registry import register_program, unregister_program
from occviz.jobs.runner import run_job
from occviz.jobs.snapshots import State
from occviz.jobs.tasks import create_job

pytestmark = pytest.mark.django_db(transaction=True)


class Relay:
    """Runs counter jobs one after the other, as its parts."""

    name = "relay"
    figures = ()
    kinds = ()

    def clean(self, data: Mapping[str, Any]) -> dict[str, Any]:
        return {"legs": int(data.get("legs", 2)), "seconds": float(data.get("seconds", 0.2))}

    def connections(self, params: Mapping[str, Any]) -> int:
        return 2

    def read_state(self, job_id: int, params: Mapping[str, Any]) -> State:
        return State()

    def tag(self, params: Mapping[str, Any]) -> str:
        return ""

    def run(self, context: JobContext) -> dict[str, Any]:
        legs = []
        for _ in range(context.params["legs"]):
            if context.stop.is_set():
                break
            leg = run_child(context, "counter", {"strategy": "occ", "writers": 2, "seconds": context.params["seconds"]})
            legs.append({"job": leg.pk, "status": leg.status})
        return {"legs": legs, "invariant_ok": True, "invariant": f"{len(legs)} legs"}


@pytest.fixture
def relay() -> Iterator[None]:
    register_program(Relay())  # type: ignore[arg-type]
    yield
    unregister_program("relay")


def test_each_part_is_a_job_of_its_own_linked_to_its_parent(relay: None, alice: Any) -> None:
    parent = create_job("relay", {"legs": 2}, alice)
    run_job(parent.pk)
    parent.refresh_from_db()
    legs = parent.summary["legs"]
    children = list(Job.objects.filter(parent=parent).order_by("id"))
    assert [leg["job"] for leg in legs] == [child.pk for child in children]
    assert [child.status for child in children] == ["succeeded", "succeeded"]
    assert all(child.created_by == alice and child.summary["committed"] > 0 for child in children)


def test_parts_are_not_admitted_again(relay: None, alice: Any, settings: Any) -> None:
    # One job per person: the parent is that job, and its parts run inside its admission.
    settings.OCCVIZ_MAX_JOBS_PER_USER = 1
    parent = create_job("relay", {"legs": 1}, alice)
    run_job(parent.pk)
    parent.refresh_from_db()
    assert parent.status == "succeeded"
    assert Job.objects.get(parent=parent).status == "succeeded"


def test_cancelling_the_parent_stops_the_part_running_now(relay: None) -> None:
    parent = create_job("relay", {"legs": 3, "seconds": 60})

    def run() -> None:
        try:
            run_job(parent.pk)
        finally:
            connections.close_all()

    runner = threading.Thread(target=run)
    runner.start()
    deadline = time.monotonic() + 30
    while not Job.objects.filter(parent=parent, status="running").exists():
        assert time.monotonic() < deadline, "the first part never started"
        time.sleep(0.05)
    parent.request_cancel()
    runner.join(30)
    assert not runner.is_alive()
    parent.refresh_from_db()
    children = list(Job.objects.filter(parent=parent))
    assert parent.status == "cancelled"
    assert [child.status for child in children] == ["cancelled"]  # stopped, and no further part begun
    assert children[0].summary["duration_s"] < 30


def test_a_part_s_page_links_its_parent(relay: None, alice: Any, client: Any) -> None:
    client.force_login(alice)
    parent = create_job("relay", {"legs": 1}, alice)
    run_job(parent.pk)
    child = Job.objects.get(parent=parent)
    page = client.get(f"/jobs/{child.pk}/").content.decode()
    assert f'href="/jobs/{parent.pk}/" data-parent>job #{parent.pk}</a>' in page
    assert "data-parent" not in client.get(f"/jobs/{parent.pk}/").content.decode()
