"""Controllers A and B on a real Deployment row: no field lost with occ, lost fields counted exactly with none.

Races are made to happen: several controllers start together, reconcile fast and think
between their GET and their write. The lost fields are recomputed here independently
from the stored events (each acknowledged write's version read, version written and
value), replaying the object's history version by version, and checked against the
stored object.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from occviz.jobs.models import Event, Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.scenarios import SCENARIOS
from occviz.scenarios.controllers.deployment import FIELDS, controller_name
from occviz.scenarios.controllers.history import Erasure, History
from occviz.store.models import Deployment

pytestmark = pytest.mark.django_db(transaction=True)


def run_controllers(**params: Any) -> Job:
    job = create_job("controllers", params)
    return run_job(job.pk)


def stored_values(job: Job, controllers: int) -> tuple[int, tuple[int, ...]]:
    deployment = Deployment.objects.get(job=job)
    content = {column: getattr(deployment, column) for column in ("replicas", "labels", "annotations", "status")}
    return deployment.resource_version, tuple(owned.get(content) for owned in FIELDS[:controllers])


def replay(job: Job, controllers: int) -> tuple[dict[int, tuple[int, ...]], set[tuple[int, int]]]:
    """The object at every version, from the acknowledged writes alone, and the writes (owner, version) lost.

    A write at version V that read version R leaves the object as it was at R with its
    own field set (a compare-and-swap has R = V - 1; a blind write may not). A write is
    lost when its field changes before its owner writes it again.
    """
    commits = sorted(Event.objects.filter(job=job, kind="committed"), key=lambda e: e.version_written or 0)
    states: dict[int, tuple[int, ...]] = {1: (0,) * controllers}
    own: dict[int, list[tuple[int, int]]] = {n: [] for n in range(1, controllers + 1)}
    for event in commits:
        assert event.version_written == len(states) + 1, "every version after the first is one acknowledged write"
        assert event.version_read is not None and event.value_written is not None
        state = list(states[event.version_read])
        state[event.actor - 1] = event.value_written
        states[event.version_written] = tuple(state)
        own[event.actor].append((event.version_written, event.value_written))
    final = len(states)
    lost = set()
    for actor, writes in own.items():
        for i, (version, value) in enumerate(writes):
            until = writes[i + 1][0] if i + 1 < len(writes) else final + 1
            if any(states[v][actor - 1] != value for v in range(version + 1, until)):
                lost.add((actor, version))
    return states, lost


def test_occ_loses_no_field_while_conflicts_happen() -> None:
    job = run_controllers(strategy="occ", controllers=4, rate_per_s=100, think_ms=5, seconds=2, max_attempts=50)
    summary = job.summary
    assert job.status == Job.Status.SUCCEEDED, job.error
    assert summary is not None
    assert summary["conflicts"] > 20 and summary["retries"] > 20, "the controllers really raced"
    assert summary["lost_fields"] == 0
    assert summary["invariant_ok"] is True, summary["invariant"]
    assert "every controller's last write is on the object" in summary["invariant"]
    assert not Event.objects.filter(job=job, kind="erased").exists()

    states, lost = replay(job, 4)
    version, on_object = stored_values(job, 4)
    assert lost == set()
    assert states[version] == on_object, "the replayed history is the stored object"
    assert version - 1 == summary["writes"]
    for number, entry in enumerate(summary["per_controller"], start=1):
        assert entry["controller"] == controller_name(number)
        assert entry["writes"] > 0 and entry["last_write_present"] is True
        assert on_object[number - 1] == entry["last_value"], "every controller's last write is present"


def test_none_counts_lost_fields_exactly_against_the_stored_history() -> None:
    job = run_controllers(strategy="none", controllers=3, rate_per_s=100, think_ms=5, seconds=2)
    summary = job.summary
    assert job.status == Job.Status.SUCCEEDED, job.error
    assert summary is not None
    assert summary["invariant_ok"] is True, summary["invariant"]
    assert summary["conflicts"] == 0 and summary["retries"] == 0, "blind writes never conflict"

    states, lost = replay(job, 3)
    version, on_object = stored_values(job, 3)
    assert states[version] == on_object, "the replayed history is the stored object"
    assert len(lost) > 10, "blind writes erased fields"
    assert summary["lost_fields"] == len(lost)
    # Each erased event names the lost write (its owner and version) and the write that erased it.
    erased = list(Event.objects.filter(job=job, kind="erased"))
    assert {(e.detail["victim_actor"], e.detail["set_at"]) for e in erased} == lost
    for e in erased:
        victim, set_at = e.detail["victim_actor"], e.detail["set_at"]
        eraser_version = e.version_written
        assert eraser_version is not None and e.actor != victim
        assert e.detail["field"] == FIELDS[victim - 1].path
        assert states[set_at][victim - 1] == e.value_read, "the value erased is the one the victim wrote"
        assert states[eraser_version][victim - 1] == e.value_written != e.value_read
        # It was the first write to change the field after the victim's.
        assert all(states[v][victim - 1] == e.value_read for v in range(set_at, eraser_version))
    assert sum(entry["lost"] for entry in summary["per_controller"]) == len(lost)
    # The verdict says whose field lost its last write, and that with none this is the lesson.
    gone = [entry for entry in summary["per_controller"] if not entry["last_write_present"]]
    for entry in gone:
        assert f"{entry['controller']}'s {entry['field']}" in summary["invariant"]
    if gone:
        assert "With none that is the lesson" in summary["invariant"]
    else:
        assert "every controller's last write is on the object, but earlier ones were erased" in summary["invariant"]


def test_history_counts_a_lost_write_once_even_when_a_blind_write_puts_it_back() -> None:
    erasures: list[Erasure] = []
    history = History(1, [0, 0, 0], on_erased=erasures.append)
    history.acknowledge(1, 1, 1, 2, (1, 0, 0))  # A sets 1 at v2
    history.acknowledge(2, 1, 1, 3, (0, 1, 0))  # B read v1: erases A's 1
    history.acknowledge(3, 1, 2, 4, (1, 0, 1))  # C read v2: puts A's 1 back, erases B's 1
    history.acknowledge(2, 2, 3, 5, (0, 2, 0))  # B read v3: erases A's 1 again (already lost), and C's 1
    assert [(e.eraser, e.version, e.victim, e.set_at) for e in erasures] == [(2, 3, 1, 2), (3, 4, 2, 3), (2, 5, 3, 4)]


def test_history_applies_writes_in_version_order_whatever_order_they_arrive_in() -> None:
    erasures: list[Erasure] = []
    history = History(1, [0, 0], on_erased=erasures.append)
    history.acknowledge(1, 1, 1, 3, (1, 1))  # arrives before v2, which it follows
    assert history.version == 1 and history.waiting == 1
    history.acknowledge(2, 1, 1, 2, (0, 1))
    assert history.version == 3 and history.values == [1, 1] and not erasures


def test_runjob_json_has_the_controllers_keys(run_manage) -> None:  # type: ignore[no-untyped-def]
    result = run_manage(
        "runjob", "controllers", "--controllers", "2", "--strategy", "occ", "--seconds", "1", "--rate-per-s", "50",
        "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary.keys() >= {
        "id", "scenario", "controllers", "writes", "conflicts", "retries", "lost_fields", "per_controller",
        "invariant_ok", "invariant", "duration_s",
    }  # fmt: skip
    assert summary["controllers"] == 2 and summary["lost_fields"] == 0 and summary["invariant_ok"] is True
    assert [entry["controller"] for entry in summary["per_controller"]] == ["controller A", "controller B"]
    for entry in summary["per_controller"]:
        assert entry["writes"] > 0 and entry["last_value"] == entry["on_object"]
    assert sum(entry["writes"] for entry in summary["per_controller"]) == summary["writes"]
    assert Job.objects.get(pk=summary["id"]).summary == summary


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--controllers", "1"], "--controllers: Ensure this value is greater than or equal to 2"),
        (["--controllers", "9"], "--controllers: Ensure this value is less than or equal to 8"),
        (["--rate-per-s", "-5"], "--rate-per-s: Ensure this value is greater than or equal to 0.1"),
        (["--strategy", "optimistic"], "invalid choice: 'optimistic'"),
        (["--seconds", "0"], "--seconds: Ensure this value is greater than or equal to 0.5"),
    ],
)
def test_bad_input_gets_a_clear_error_exit_2_and_starts_nothing(run_manage, flags, message) -> None:  # type: ignore[no-untyped-def]
    result = run_manage("runjob", "controllers", *flags, "--json")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert result.stdout == ""
    assert not Job.objects.exists()
    assert not Deployment.objects.exists()


def test_the_launch_page_offers_the_presets(signed_in: Client) -> None:
    response = signed_in.get("/jobs/new/controllers/?preset=two-none")
    assert response.status_code == 200
    html = response.content.decode()
    for preset in SCENARIOS["controllers"].presets:
        assert f'data-preset="{preset.slug}"' in html
    assert "Two controllers, none (lost fields)" in html


def test_the_live_state_after_the_job_shows_each_field_and_last_write() -> None:
    job = run_controllers(strategy="none", controllers=2, rate_per_s=50, think_ms=5, seconds=1)
    state = SCENARIOS["controllers"].read_state(job.pk, job.params)
    assert state.data["deployment"]["resourceVersion"] == job.summary["object_version"]  # type: ignore[index]
    rows = state.data["controllers"]
    assert [row["field"] for row in rows] == [FIELDS[0].path, FIELDS[1].path]
    for row, entry in zip(rows, job.summary["per_controller"], strict=True):  # type: ignore[index]
        assert row["last_value"] == entry["last_value"] and row["on_object"] == entry["on_object"]


def test_the_job_page_shows_the_deployment_and_the_controllers(signed_in: Client) -> None:
    job = run_controllers(strategy="occ", controllers=2, rate_per_s=50, think_ms=5, seconds=1)
    assert job.summary is not None
    html = signed_in.get(f"/jobs/{job.pk}/").content.decode()
    assert "kind: Deployment" in html
    assert f'resourceVersion: "<strong data-version>{job.summary["object_version"]}</strong>"' in html
    assert 'data-controller="1"' in html and 'data-controller="2"' in html
    assert "status.observedGeneration" in html and "spec.replicas" in html
    assert "Invariant holds" in html


# -- a student's edits during the job ---------------------------------------------------------------


def test_outside_writes_during_an_occ_job_are_followed_and_the_verdict_holds() -> None:
    """`kubectl edit` of the Deployment while A and B reconcile it: versions of the history on the student's lane.

    The student sets spec.replicas (B's field) three times from the version just read (retrying
    a 409 as kubectl's user would), and once sends a stale replace that is refused.
    """
    import threading
    import time

    from occviz.store import writes
    from occviz.store.models import VersionConflict

    student = writes.Writer("api", "student (token laptop)")
    job = create_job(
        "controllers", {"strategy": "occ", "controllers": 2, "rate_per_s": 40, "think_ms": 5, "seconds": 3}
    )
    done: dict[str, Any] = {"commits": 0, "refused": 0, "error": None}

    def edit() -> None:
        from django.db import connection

        try:
            deadline = time.monotonic() + 20
            while not Job.objects.filter(pk=job.pk, status=Job.Status.RUNNING).exists():
                assert time.monotonic() < deadline
                time.sleep(0.005)
            time.sleep(0.5)  # B has written replicas by now
            stale = Deployment.objects.get(job=job)
            for n in range(3):
                while True:
                    current = Deployment.objects.get(job=job)
                    try:
                        writes.update(
                            current, {"replicas": 900 + n}, student, expected_version=current.resource_version
                        )
                        break
                    except VersionConflict:
                        done["refused"] += 1
                done["commits"] += 1
                time.sleep(0.4)
            try:
                writes.update(stale, {"replicas": 1}, student, expected_version=stale.resource_version)
            except VersionConflict:
                done["refused"] += 1
        except BaseException as error:  # reported by the test
            done["error"] = error
        finally:
            connection.close()

    editor = threading.Thread(target=edit)
    editor.start()
    job = run_job(job.pk)
    editor.join(30)
    assert done["error"] is None, done["error"]
    summary = job.summary
    assert job.status == Job.Status.SUCCEEDED, job.error
    assert summary is not None

    assert summary["invariant_ok"] is True, summary["invariant"]
    assert summary["outside_writes"] == done["commits"] == 3
    assert summary["outside_conflicts"] == done["refused"] >= 1
    # Each edit changed B's latest write: erased from outside, not by the other controller.
    assert summary["erased_from_outside"] == 3 and summary["lost_fields"] == 0
    assert summary["per_controller"][1]["erased_from_outside"] == 3
    assert "3 write(s) from outside followed, erasing 3 controller write(s)" in summary["invariant"]
    version, _ = stored_values(job, 2)
    assert version - 1 == summary["writes"] + 3, "every version is a controller's write or the student's"
    lane = "api: student (token laptop)"
    erased = Event.objects.filter(job=job, kind="outside_erased")
    assert [(e.detail["lane"], e.detail["victim"], e.value_written) for e in erased.order_by("seq")] == [
        (lane, "controller B", 900 + n) for n in range(3)
    ]
    followed = Event.objects.filter(job=job, kind="outside_write")
    assert {e.detail["lane"] for e in followed} == {lane}
    assert all(e.detail["changed"] == "spec.replicas" for e in followed)
    # B re-applied its own value after the last edit: its last write is on the object.
    assert summary["per_controller"][1]["last_write_present"] is True
