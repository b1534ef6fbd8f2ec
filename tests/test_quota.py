"""The quota race on a real ResourceQuota row: exactly `hard` admitted, denials as the API server words them, the leak
and its repair.

Jobs run through the real runner and recorder, in this process; admission workers are
threads released by one barrier, each with its own PostgreSQL connection, and an
admission time between read and write makes the conflicts happen.
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client

from occviz.jobs.models import Event, Job
from occviz.jobs.recorder import EventRecorder
from occviz.jobs.registry import ParamsError
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.scenarios import SCENARIOS
from occviz.scenarios.quota.actors import (
    RESOURCE,
    Admission,
    ChargeLedger,
    QuotaController,
    exceeded_message,
    read_quota,
    write_used,
)
from occviz.store import admission as store_admission
from occviz.store.models import Pod, ResourceQuota

pytestmark = pytest.mark.django_db(transaction=True)

EXCEEDED = (
    r'pods "pod-\d+" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=1, '
    r"used: requests.nvidia.com/gpu=1, limited: requests.nvidia.com/gpu=1"
)


def run_quota(**params: Any) -> Job:
    job = run_job(create_job("quota", params).pk)
    assert job.status == Job.Status.SUCCEEDED, job.error
    assert job.summary is not None
    return job


def summary_of(job: Job) -> dict[str, Any]:
    assert job.summary is not None
    return job.summary


def events(job: Job, *kinds: str) -> list[Event]:
    return list(Event.objects.filter(job=job, kind__in=kinds).order_by("seq"))


# -- exactly `hard` admitted ----------------------------------------------------------------------


def test_two_pods_for_one_gpu_admit_exactly_one() -> None:
    for _ in range(3):
        job = run_quota(pods=2, hard=1, request=1, workers=2, think_ms=20)
        summary = summary_of(job)
        assert (summary["admitted"], summary["denied"]) == (1, 1), summary
        # Both read used 0 at v1 and wrote: one won, the other's write matched no row, re-read and was denied.
        assert summary["admission_conflicts"] == 1 and summary["admission_retries"] == 1
        (denied,) = events(job, "denied")
        assert denied.detail["message"] == exceeded_message(f"pod-{denied.op}", 1, 1, 1)
        assert denied.attempt == 2
        assert Pod.objects.filter(job=job).count() == 1
        assert (summary["used_final"], summary["actual_final"], summary["over_admitted"]) == (1, 1, 0)
        assert summary["invariant_ok"], summary["invariant"]


def test_a_hundred_pods_for_ten_slots_admit_exactly_ten_through_conflicts() -> None:
    job = run_quota(pods=100, hard=10, request=1, workers=8, think_ms=5)
    summary = summary_of(job)
    assert summary["admitted"] == 10 and summary["denied"] == 90, summary
    assert summary["admission_conflicts"] > 0, "the workers really raced for the quota row"
    assert summary["admission_retries"] > 0
    assert Pod.objects.filter(job=job).count() == 10
    assert (summary["used_final"], summary["actual_final"], summary["over_admitted"]) == (10, 10, 0)
    quota = ResourceQuota.objects.get(job=job)
    assert quota.used == {RESOURCE: 10}
    # Every version the quota went through was one admission's charge: ten writes, no lost charge.
    assert quota.resource_version == 1 + 10
    assert sorted(event.value_written or 0 for event in events(job, "admitted")) == list(range(1, 11))
    for denial in events(job, "denied", "retries_exhausted"):
        assert denial.detail["message"], "every denial says why"
    assert summary["invariant_ok"], summary["invariant"]


def test_denials_carry_the_api_servers_message() -> None:
    job = run_quota(pods=12, hard=2, request=1, workers=4, think_ms=2)

    denials = events(job, "denied")
    assert denials
    for denial in denials:
        assert re.fullmatch(
            rf'pods "pod-{denial.op}" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=1, '
            r"used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2",
            denial.detail["message"],
        )
    for gave_up in events(job, "retries_exhausted"):
        assert gave_up.detail["message"] == (
            'Operation cannot be fulfilled on resourcequotas "gpu-quota": the object has been modified; '
            "please apply your changes to the latest version and try again"
        )
        assert gave_up.attempt == 4, "the first try and the API server's 3 retries"
    assert re.fullmatch(EXCEEDED, exceeded_message("pod-3", 1, 1, 1))


# -- the leak and the resync ----------------------------------------------------------------------


def test_the_leak_appears_with_failed_creates_and_the_resync_repairs_it() -> None:
    job = run_quota(
        pods=40, hard=100, request=2, workers=2, think_ms=1, create_failure_rate=0.25, resync_seconds=1, seed=7
    )
    summary = summary_of(job)
    failures, admitted = summary["create_failures"], summary["admitted"]
    assert failures > 0 and admitted >= 30
    # Under contention a pod can lose its 4 attempts: denied with the conflict, as the API server does.
    assert admitted + summary["denied"] == 40 and summary["denied"] == summary["denied_after_retries"]
    exists = 2 * (admitted - failures)
    assert summary["stored_pods"] == admitted - failures
    # Before the resync: every admission charged, and the failed ones' usage stayed charged.
    assert max(event.value_written or 0 for event in events(job, "admitted")) == 2 * admitted
    assert summary["leaked"] == 2 * failures
    (repair,) = events(job, "resync")
    assert (repair.value_read, repair.value_written) == (2 * admitted, exists)
    assert repair.detail["released"] == 2 * failures and not repair.detail["admitting"]
    assert repair.t_ms >= 1000, "at the resync period, not before"
    # After it: used is what the pods that exist request, in the row itself.
    assert summary["used_final"] == summary["actual_final"] == exists
    assert ResourceQuota.objects.get(job=job).used == {RESOURCE: exists}
    assert summary["resyncs"] == 1 and summary["settled"] and summary["invariant_ok"], summary["invariant"]


def test_without_a_resync_in_time_the_leak_stands_and_is_said() -> None:
    job = run_quota(pods=20, hard=20, request=1, workers=4, think_ms=1, create_failure_rate=0.5, seconds=0.5, seed=3)
    summary = summary_of(job)
    assert summary["resyncs"] == 0 and summary["create_failures"] > 0
    assert summary["leaked"] == summary["used_final"] - summary["actual_final"] == summary["create_failures"]
    assert "a leak of" in summary["invariant"] and "stands" in summary["invariant"]
    assert summary["invariant_ok"], "the leak is the lesson, not a broken invariant"
    # The verdict tells the pods admitted apart from the charged used, which the leak took higher.
    held, used = summary["most_admitted_usage"], summary["most_used"]
    assert used == summary["used_final"] > held
    assert f"the pods admitted never held more than hard 20 (at most {held} at once)" in summary["invariant"]
    charged = f"the charged used peaked at {used}: it also carries the charges of creates that failed"
    assert charged in summary["invariant"]


def test_the_resync_races_admissions_without_over_admitting() -> None:
    job = run_quota(
        pods=500,
        hard=20,
        request=1,
        workers=4,
        think_ms=25,
        create_failure_rate=0.3,
        resync_seconds=1,
        seconds=5,
        seed=11,
    )
    summary = summary_of(job)
    resyncs = events(job, "resync", "resync_in_sync")
    during = [resync for resync in resyncs if resync.detail["admitting"]]
    assert len(during) >= 2, "resyncs ran while admissions were under way"
    assert summary["resync_repairs"] >= 1
    # Repaired slots were taken again: more pods admitted than `hard`, never more than `hard` at once.
    assert summary["admitted"] > 20
    assert summary["over_admitted"] == 0 and summary["most_admitted_usage"] <= 20
    assert Pod.objects.filter(job=job).count() <= 20
    assert summary["used_final"] == summary["actual_final"], "the last resync ran with nothing in flight"
    assert summary["invariant_ok"], summary["invariant"]


def test_a_resync_never_releases_a_charge_whose_create_is_under_way() -> None:
    job = Job.objects.create(scenario="quota", params={})
    quota = ResourceQuota.objects.create(namespace="race", name="gpu-quota", hard={RESOURCE: 1}, used={RESOURCE: 0})
    ledger = ChargeLedger(job.pk, quota.pk, hard=1)
    recorder = EventRecorder(job.pk)
    admission = Admission(
        job_id=job.pk, namespace="race", quota_id=quota.pk, pods=1, request=1, think_ms=0, failure_rate=0.0, seed=1,
        recorder=recorder, stop=threading.Event(), ledger=ledger,
    )  # fmt: skip
    admission.make()
    controller = QuotaController(admission, resync_s=1.0, until_repaired=False)
    # Charged, its pod not yet written: the recalculation counts it, so nobody takes its GPU.
    with ledger.charging():
        assert write_used(quota.pk, 1, 1) == 2
        ledger.charged("pod-1", 1)
    controller.resync()
    assert read_quota(quota.pk).used == 1
    # The create fails: now the charge is a leak, and the next resync releases it.
    ledger.failed("pod-1")
    controller.resync()
    after = read_quota(quota.pk)
    assert (after.used, after.version) == (0, 3)
    recorder.flush()
    kinds = [event.kind for event in Event.objects.filter(job=job).order_by("seq")]
    assert kinds == ["resync_in_sync", "resync"]


def test_a_resync_counts_the_pods_the_admin_recalculation_counts() -> None:
    # One rule for what a quota charges, the quota controller's and the admin's: a Failed pod holds nothing.
    job = Job.objects.create(scenario="quota", params={})
    quota = ResourceQuota.objects.create(namespace="race", name="gpu-quota", hard={RESOURCE: 4}, used={RESOURCE: 4})
    Pod.objects.create(namespace="race", name="running", requests={RESOURCE: 1}, phase="Running")
    Pod.objects.create(namespace="race", name="pending", requests={RESOURCE: 2})
    Pod.objects.create(namespace="race", name="failed", requests={RESOURCE: 1}, phase="Failed")
    admission = Admission(
        job_id=job.pk, namespace="race", quota_id=quota.pk, pods=1, request=1, think_ms=0, failure_rate=0.0, seed=1,
        recorder=EventRecorder(job.pk), stop=threading.Event(), ledger=ChargeLedger(job.pk, quota.pk, hard=4),
    )  # fmt: skip
    admission.make()
    QuotaController(admission, resync_s=1.0, until_repaired=False).resync()
    assert read_quota(quota.pk).used == 3 == store_admission.recount("race", [RESOURCE])[RESOURCE]


def test_a_resync_waits_for_a_charge_being_written() -> None:
    job = Job.objects.create(scenario="quota", params={})
    quota = ResourceQuota.objects.create(namespace="race", name="gpu-quota", hard={RESOURCE: 1}, used={RESOURCE: 0})
    ledger = ChargeLedger(job.pk, quota.pk, hard=1)
    ledger.make()
    entered = threading.Event()
    release = threading.Event()

    def admission() -> None:
        try:
            with ledger.charging():
                entered.set()
                release.wait(5)
                ledger.charged("pod-1", 1)
        finally:
            connection.close()

    writer = threading.Thread(target=admission)
    writer.start()
    entered.wait(5)
    seen: list[dict[str, int]] = []

    def snapshot() -> None:
        try:
            with ledger.snapshot() as pending:
                seen.append(pending)
        finally:
            connection.close()

    reader = threading.Thread(target=snapshot)
    reader.start()
    reader.join(0.2)
    assert reader.is_alive(), "the snapshot waits while a charge is being written"
    release.set()
    reader.join(5)
    writer.join(5)
    assert seen == [{"pod-1": 1}]


# -- headless, and bad input ----------------------------------------------------------------------

SUMMARY_KEYS = {
    "pods", "hard", "admitted", "denied", "admission_conflicts", "admission_retries", "create_failures", "leaked",
    "resyncs", "used_final", "actual_final", "over_admitted",
    # the common keys, as every job's summary has them
    "id", "scenario", "status", "stopped_by", "events", "invariant_ok", "invariant", "duration_s", "seed",
}  # fmt: skip


def test_runjob_prints_the_summary_keys(run_manage: Any) -> None:
    result = run_manage(
        "runjob", "quota", "--pods", "100", "--hard", "10", "--request", "1", "--create-failure-rate", "0.2",
        "--resync-seconds", "1", "--seconds", "3", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary.keys() >= SUMMARY_KEYS, SUMMARY_KEYS - summary.keys()
    assert summary["scenario"] == "quota" and summary["status"] == "succeeded"
    assert (summary["pods"], summary["hard"]) == (100, 10)
    assert summary["over_admitted"] == 0 and summary["invariant_ok"]
    assert summary["resyncs"] >= 2 and summary["used_final"] == summary["actual_final"]


@pytest.mark.parametrize(
    ("flags", "field", "says"),
    [
        (["--pods", "0"], "--pods", "greater than or equal to 1"),
        (["--pods", "501"], "--pods", "less than or equal to 500"),
        (["--hard", "-1"], "--hard", "greater than or equal to 0"),
        (["--request", "0"], "--request", "greater than or equal to 1"),
        (["--create-failure-rate", "1.5"], "--create-failure-rate", "less than or equal to 1"),
        (["--create-failure-rate", "-0.1"], "--create-failure-rate", "greater than or equal to 0"),
        (["--resync-seconds", "0.5"], "--resync-seconds", "greater than or equal to 1"),
        (["--workers", "0"], "--workers", "greater than or equal to 1"),
        (["--workers", "999"], "--workers", "OCCVIZ_MAX_WRITERS"),
    ],
)
def test_bad_input_is_refused_and_starts_nothing(flags: list[str], field: str, says: str) -> None:
    with pytest.raises(CommandError) as refused:
        call_command("runjob", "quota", *flags, "--json")
    assert refused.value.returncode == 2
    assert str(refused.value).startswith("invalid job:") and field in str(refused.value) and says in str(refused.value)
    assert not Job.objects.exists()
    assert not ResourceQuota.objects.exists() and not Pod.objects.exists()


def test_bad_input_from_a_form_names_the_field() -> None:
    with pytest.raises(ParamsError) as refused:
        create_job("quota", {"pods": 0, "hard": -3, "create_failure_rate": 2})
    assert set(refused.value.errors) == {"pods", "hard", "create_failure_rate"}
    assert not Job.objects.exists()


def test_runjob_exits_2_on_bad_input_in_a_real_process(run_manage: Any) -> None:
    result = run_manage("runjob", "quota", "--pods", "0", "--json")
    assert result.returncode == 2
    assert "--pods" in result.stderr and "greater than or equal to 1" in result.stderr
    assert not Job.objects.exists()


# -- the declaration and the pages ----------------------------------------------------------------


def test_every_preset_is_valid_and_the_defaults_are_kubernetes() -> None:
    spec = SCENARIOS["quota"]
    assert [preset.slug for preset in spec.presets] == ["two-pods-one-gpu", "hundred-pods-ten-slots", "leak-and-repair"]
    for preset in spec.presets:
        spec.clean(preset.params)
    defaults = spec.clean({})
    assert defaults["resync_seconds"] == 300.0, "kube-controller-manager's --resource-quota-sync-period"
    assert (defaults["pods"], defaults["hard"], defaults["request"]) == (2, 1, 1)
    assert spec.actor_names({**defaults, "workers": 3, "pods": 10}) == [
        "quota-controller", "admission-1", "admission-2", "admission-3",
    ]  # fmt: skip
    assert spec.connections({**defaults, "workers": 8, "pods": 2}) == 3, "no more workers than pods, and the controller"


def test_the_job_page_shows_the_quota_and_the_verdict(signed_in: Client) -> None:
    job = run_quota(pods=10, hard=3, request=1, workers=4, think_ms=2)
    page = signed_in.get(f"/jobs/{job.pk}/").content.decode()
    assert "Quota race" in page and "gpu-quota" in page
    assert "Invariant holds" in page and "the pods admitted never held more than hard 3" in page
    assert 'data-counter="admitted"' in page and "occviz/scenarios/quota.js" in page
    assert "admission-1" in page or "admission-2" in page or "quota-controller" in page
    state = SCENARIOS["quota"].read_state(job.pk, job.params)
    assert state.data["quota"]["used"] == 3 and state.figures == {"used": 3, "actual": 3, "gap": 0}


# -- pods created over the API while the job runs -------------------------------------------------


class ApiCreates(threading.Thread):
    """Pod creates in the job's namespace as the HTTP API makes them (occviz.api.quota's admission, store.writes)."""

    def __init__(self, job_id: int, seconds: float, pause_s: float, after_kind: str | None = None) -> None:
        super().__init__(name="api-creates")
        self.job_id, self.seconds, self.pause_s, self.after_kind = job_id, seconds, pause_s, after_kind
        self.created: list[str] = []
        self.refused: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        from django.db import connection

        from occviz.api import quota
        from occviz.api.status import ApiError
        from occviz.store import writes

        alice = writes.Writer("api", "alice (token laptop)")
        try:
            deadline = time.monotonic() + 20
            namespace = f"job-{self.job_id}"
            while not ResourceQuota.objects.filter(namespace=namespace).exists():
                assert time.monotonic() < deadline, "the job never made its quota"
                time.sleep(0.005)
            while self.after_kind and not Event.objects.filter(job_id=self.job_id, kind=self.after_kind).exists():
                assert time.monotonic() < deadline, f"the job recorded no {self.after_kind}"
                time.sleep(0.005)
            until = time.monotonic() + self.seconds
            number = 0
            while time.monotonic() < until:
                number += 1
                fields = {"requests": {RESOURCE: 1}}
                try:
                    with quota.admitted(namespace, f"api-{number}", fields, alice):
                        writes.create(Pod, {"namespace": namespace, "name": f"api-{number}", **fields}, alice)
                    self.created.append(f"api-{number}")
                except ApiError as refused:
                    assert refused.code in (403, 409), refused.message
                    self.refused.append(refused.message)
                time.sleep(self.pause_s)
        except BaseException as error:  # reported by the test
            self.error = error
        finally:
            connection.close()


def test_api_creates_contend_with_a_running_job_and_the_verdict_counts_both() -> None:
    job = create_job(
        "quota",
        {
            "pods": 300, "hard": 20, "request": 1, "workers": 4, "think_ms": 15, "create_failure_rate": 0.5,
            "resync_seconds": 1, "seconds": 4, "seed": 5,
        },
    )  # fmt: skip
    # The API's creates start once the job has leaked a charge (half its creates fail after it), so the
    # resync has a leak to repair whoever wins the slots; the API, thinking less, then takes most of them.
    outside = ApiCreates(job.pk, seconds=3.0, pause_s=0.01, after_kind="create_failed")
    outside.start()
    job = run_job(job.pk)
    outside.join(30)
    assert outside.error is None, outside.error
    assert job.status == Job.Status.SUCCEEDED, job.error
    summary = summary_of(job)

    assert outside.created and outside.refused, "the API's creates were admitted and denied"
    assert summary["outside_admitted"] == len(outside.created), "every API charge followed, on its lane"
    lanes = Event.objects.filter(job=job, kind="outside_charge")
    assert {event.detail["lane"] for event in lanes} == {"api: alice (token laptop)"}
    # Never more than `hard` at once, counting both: the resync counts the API's pods among those that exist.
    assert summary["over_admitted"] == 0 and summary["most_admitted_usage"] <= 20, summary["invariant"]
    namespace_pods = Pod.objects.filter(namespace=f"job-{job.pk}")
    assert namespace_pods.count() <= 20 and summary["actual_final"] == namespace_pods.count()
    assert namespace_pods.filter(job=None).count() <= len(outside.created)
    assert summary["resync_repairs"] >= 1, "leaks were repaired while the API's pods existed"
    assert summary["invariant_ok"], summary["invariant"]
    assert "from outside" in summary["invariant"]
