"""The quota race and the controller race over several processes: `runjob --processes 2`, each shard a real process.

What their actors share beyond the contended row lives in PostgreSQL (occviz.jobs.shared):
the quota's pods to take, its charges under way and its peaks; the controllers' acknowledged
writes, replayed in one history. Each job over 2 processes is checked against the same job
in one: the summary's shape, the invariant, and every event stored once in one sequence.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from typing import Any

import pytest

from occviz.jobs.models import Event, EventBatch, Job, JobShared
from occviz.jobs.registry import ParamsError
from occviz.jobs.tasks import connections_needed, create_job
from occviz.scenarios.controllers.scenario import ControllersForm
from occviz.scenarios.quota.scenario import QuotaForm
from occviz.store.models import Deployment, Pod
from tests.helpers import output, wait_for
from tests.test_shards import HOST, assert_gapless_and_once, running_shards, shards_of, start_manage

__all__ = ["start_manage"]  # the fixture, used here by name

pytestmark = pytest.mark.django_db(transaction=True)


def one_and_two(start_manage: Any, *args: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same job in one process and in two (at once: they contend for the machine, not for rows)."""
    one, two = start_manage(*args, "--json"), start_manage(*args, "--json", "--processes", "2")
    assert one.wait(120) == 0, output(one)
    assert two.wait(120) == 0, output(two)
    assert "Traceback" not in output(two)[1], output(two)[1]
    single, summary = json.loads(output(one)[0]), json.loads(output(two)[0])
    assert summary.keys() == single.keys() | {"shards"}, "the shape of a one-process job's, and its shards"
    assert (single["processes"], summary["processes"]) == (1, 2)
    assert len({shard["pid"] for shard in summary["shards"]}) == 2, "each shard a process of its own"
    return single, summary


def shard_of(summary: dict[str, Any], actor: int) -> int:
    return next(s["index"] for s in summary["shards"] if s["actors"][0] <= actor <= s["actors"][1])


QUOTA = [
    "runjob", "quota", "--pods", "80", "--hard", "20", "--request", "1", "--workers", "6", "--think-ms", "3",
    "--create-failure-rate", "0.25", "--resync-seconds", "1", "--seed", "7",
    "--latency-ms", "1",  # every actor through a proxy of its own process, a shard's as the coordinator's
]  # fmt: skip


# Serial: the quota must settle (the leak repaired by a resync) within the job's seconds, which load outlasted.
@pytest.mark.serial
def test_a_quota_race_over_two_processes_admits_each_pod_once_and_never_over_hard(start_manage) -> None:  # type: ignore[no-untyped-def]
    single, summary = one_and_two(start_manage, *QUOTA)
    assert [shard["actors"] for shard in summary["shards"]] == [[1, 4], [5, 7]], "the controller, then 6 workers"
    for each in (single, summary):
        assert each["invariant_ok"] is True, each["invariant"]
        assert each["over_admitted"] == 0 and each["most_admitted_usage"] <= 20
        assert each["used_final"] == each["actual_final"] and each["settled"], "the leak was repaired"
    assert summary["network"] == single["network"] and summary["network"]["latency_ms"] == 1, summary["network"]
    job = Job.objects.get(pk=summary["id"])
    events = assert_gapless_and_once(job)
    # One list of pods for both processes: each of the 80 decided once, by a worker of either.
    decided = [e for e in events if e.kind in ("admitted", "denied", "retries_exhausted")]
    assert sorted(e.op for e in decided) == list(range(1, 81)), "every pod taken once across the processes"
    assert {shard_of(summary, e.actor) for e in decided} == {0, 1}, "workers of both processes admitted pods"
    assert summary["admitted"] + summary["denied"] == 80
    assert summary["stored_pods"] + summary["create_failures"] == summary["admitted"]
    assert Pod.objects.filter(job=job).count() == summary["stored_pods"] == summary["actual_final"]
    assert summary["admission_conflicts"] > 0, "workers in different processes raced on the quota"
    assert summary["create_failures"] > 0 and summary["resync_repairs"] >= 1, "a leak, repaired"
    # Each stored pod's event says what the pods that exist request after it, counted over both processes.
    stored = sorted(e.value_written for e in events if e.kind == "stored")
    assert stored == list(range(1, summary["stored_pods"] + 1))
    assert not JobShared.objects.filter(job=job, name__startswith="pending:").exists(), "no charge left under way"


@pytest.mark.parametrize("strategy", ["occ", "none"])
def test_a_controller_race_over_two_processes_replays_to_the_stored_object(start_manage, strategy: str) -> None:  # type: ignore[no-untyped-def]
    args = ["runjob", "controllers", "--strategy", strategy, "--controllers", "4", "--seconds", "2"]
    single, summary = one_and_two(start_manage, *args, "--rate-per-s", "40", "--think-ms", "5", "--seed", "3")
    assert [shard["actors"] for shard in summary["shards"]] == [[1, 2], [3, 4]]
    for each in (single, summary):
        assert each["invariant_ok"] is True, each["invariant"]
        assert each["object_version"] - 1 == each["writes"], "every write of the object followed"
    job = Job.objects.get(pk=summary["id"])
    events = assert_gapless_and_once(job)
    kinds = Counter(e.kind for e in events)
    assert kinds["committed"] == summary["writes"] and kinds["erased"] == summary["lost_fields"]
    committed_by = Counter(e.actor for e in events if e.kind == "committed")
    assert sorted(committed_by) == [1, 2, 3, 4] and all(committed_by.values())
    assert summary["conflicts"] + summary["lost_fields"] > 0, "controllers in different processes raced"
    if strategy == "occ":
        assert summary["lost_fields"] == 0
    else:
        erased = [e for e in events if e.kind == "erased"]
        assert {shard_of(summary, e.detail["victim_actor"]) for e in erased} == {0, 1}, "lost across processes"
    deployment = Deployment.objects.get(job=job)
    assert summary["object_version"] == deployment.resource_version
    for row in summary["per_controller"]:
        assert row["writes"] == committed_by[ord(row["controller"][-1]) - ord("A") + 1]
    # The other process's snapshots show every controller's last write too: the history's, published.
    theirs = [
        b.snapshot
        for b in EventBatch.objects.filter(job=job).order_by("seq_from")
        if set(b.actor) <= {3, 4} and "read" in b.kind and min(b.t_us) > 500_000
    ]
    assert theirs, "the second process stored batches of its own"
    for snapshot in theirs:
        assert all(row.get("last_value") is not None for row in snapshot["state"]["controllers"]), snapshot
    assert not Event.objects.filter(job=job, kind="error").exists()


def test_bad_processes_for_the_quota_and_controllers_are_refused_and_nothing_is_made(run_manage) -> None:  # type: ignore[no-untyped-def]
    quota = {"pods": 2, "hard": 1, "request": 1, "workers": 8}
    for value, words in [
        ("4", "4 processes for 3 actors"),  # 2 pods: 2 workers and the controller
        ("17", "1 to 16 processes, not 17"),
        ("two", 'whole number of processes from 1 to 16, or "auto"'),
    ]:
        form = QuotaForm(data={**quota, "processes": value})
        assert not form.is_valid() and words in " ".join(form.errors["processes"]), form.errors
        with pytest.raises(ParamsError):
            create_job("quota", {**quota, "processes": value})
    assert QuotaForm(data={**quota, "processes": "3"}).is_valid()
    controllers = {"strategy": "occ", "controllers": 2, "seconds": 1, "rate_per_s": 10}
    form = ControllersForm(data={**controllers, "processes": "3"})
    assert not form.is_valid() and "3 processes for 2 actors" in " ".join(form.errors["processes"])
    form = ControllersForm(data={**controllers, "processes": " 2 "})
    assert form.is_valid() and form.cleaned_data["processes"] == 2
    assert ControllersForm(data=controllers).is_valid()
    # Every shard's connections are admitted with the job, and the first's follower of the stored writes.
    four = ControllersForm(data={**controllers, "controllers": 4, "processes": "2"})
    assert four.is_valid()
    assert connections_needed("controllers", four.cleaned_data) == 4 + 1 + 3 + 3 * 2 - 2
    result = run_manage("runjob", "controllers", "--controllers", "2", "--processes", "3")
    assert result.returncode == 2 and "--processes: 3 processes for 2 actors" in result.stderr, result.stderr
    result = run_manage("runjob", "quota", "--pods", "5", "--processes", "0")
    assert result.returncode == 2 and "--processes: A job runs in 1 to 16 processes, not 0." in result.stderr
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["quota", "--pods", "500", "--hard", "500", "--workers", "4", "--think-ms", "20", "--seconds", "60"],
        ["controllers", "--controllers", "4", "--seconds", "60", "--rate-per-s", "50"],
    ],
    ids=["quota", "controllers"],
)
def test_a_shard_of_either_killed_mid_job_fails_the_job_naming_it(start_manage, args: list[str]) -> None:  # type: ignore[no-untyped-def]
    runjob = start_manage("runjob", *args, "--processes", "2")
    job = wait_for(running_shards(2, events=50), timeout=60, what="the job's two shards to run")
    victim = shards_of(job.pk)[1]
    os.kill(victim.pid, signal.SIGKILL)
    assert runjob.wait(30) == 1, output(runjob)
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert f"shard 1 of 2 (runshard:{HOST}:{victim.pid}) stopped renewing its heartbeat" in job.error, job.error
    assert_gapless_and_once(job)
    assert job.summary is not None and job.summary["events"] == job.last_seq
