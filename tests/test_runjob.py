"""`manage.py runjob`, run as a user runs it: a child process, its stdout, its exit code."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from occviz.jobs.models import Job
from tests.conftest import ROOT, manage
from tests.test_serve import serve_environment

pytestmark = pytest.mark.django_db(transaction=True)

SUMMARY_KEYS = {
    "id",
    "scenario",
    "strategy",
    "writers",
    "attempts",
    "committed",
    "conflicts",
    "retries",
    "gave_up",
    "lock_wait_ms",
    "initial_value",
    "final_value",
    "lost_updates",
    "invariant_ok",
    "duration_s",
    "commits_per_s",
    "latency_ms",
}


def test_runjob_json_prints_one_summary_object_and_nothing_else(run_manage) -> None:  # type: ignore[no-untyped-def]
    result = run_manage(
        "runjob", "counter", "--writers", "8", "--increments", "20", "--rows", "1", "--strategy", "occ",
        "--retry", "k8s-default-backoff", "--max-attempts", "10", "--think-ms", "0", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary.keys() >= SUMMARY_KEYS
    assert set(summary["latency_ms"]) == {"p50", "p95", "p99"}
    assert summary["strategy"] == "occ" and summary["writers"] == 8
    assert summary["invariant_ok"] is True
    job = Job.objects.get(pk=summary["id"])
    assert job.status == Job.Status.SUCCEEDED
    assert job.summary == summary, "the job is recorded like any other"


def test_runjob_runs_for_a_duration(run_manage) -> None:  # type: ignore[no-untyped-def]
    result = run_manage("runjob", "counter", "--strategy", "atomic", "--writers", "2", "--seconds", "1", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert 1.0 <= summary["duration_s"] < 3
    assert summary["committed"] == summary["final_value"] > 0
    # Every batch is published to the job's channel group, which no one has joined here:
    # that is no reason to warn, ten times a second, on the user's terminal.
    assert "does not exist" not in result.stderr, result.stderr


@pytest.mark.slow
def test_runjob_on_a_new_data_folder_migrates_its_database_then_prints_the_summary() -> None:
    """What a new user runs straight after cloning: no DATABASE_URL, a data folder never used."""
    parent = ROOT / ".pgdata" / "tests"  # inside the project, as the embedded server wants
    parent.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="runjob-", dir=parent))
    try:
        result = manage(
            "runjob", "counter", "--writers", "4", "--increments", "10", "--strategy", "occ", "--think-ms", "1",
            "--json", env=serve_environment(None, data_dir),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        summary = json.loads(result.stdout)
        assert summary["id"] == 1 and summary["invariant_ok"] is True
        assert summary["final_value"] == summary["committed"] == 40 - summary["gave_up"] > 0
        # The embedded PostgreSQL that runjob started stopped when it exited.
        assert not (data_dir / "data" / "postmaster.pid").exists()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def test_runjob_without_json_prints_a_readable_summary(run_manage) -> None:  # type: ignore[no-untyped-def]
    result = run_manage("runjob", "counter", "--strategy", "none", "--writers", "4", "--increments", "10")
    assert result.returncode == 0, result.stderr
    assert "Counter race (none, 4 writers" in result.stdout
    assert "lost updates" in result.stdout
    assert "invariant holds" in result.stdout


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--strategy", "occ", "--writers", "0"], "--writers: Ensure this value is greater than or equal to 1"),
        (["--strategy", "occ", "--writers", "100000"], "--writers: At most 64 writers"),
        (["--strategy", "optimistic"], "invalid choice: 'optimistic'"),
        (
            ["--strategy", "occ", "--increments", "5", "--seconds", "2"],
            "--seconds: Give increments or seconds, not both",
        ),
        (["--strategy", "occ", "--writers", "four"], "invalid int value: 'four'"),
        (["--strategy", "occ", "--think-ms", "-1"], "--think-ms: Ensure this value is greater than or equal to 0"),
        (["--strategy", "occ", "--retry", "forever"], "invalid choice: 'forever'"),
        (["--strategy", "occ", "--max-attempts", "0"], "--max-attempts"),
        (["--strategy", "occ", "--increments", "10000", "--think-ms", "1000"], "more than the 300 s a job may run"),
        (["--strategy", "occ", "--bogus"], "unrecognized arguments: --bogus"),
        ([], "the following arguments are required: --strategy"),
    ],
)
def test_bad_flags_get_a_clear_error_exit_2_and_create_no_job(run_manage, flags, message) -> None:  # type: ignore[no-untyped-def]
    result = run_manage("runjob", "counter", *flags, "--json")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert result.stdout == ""
    assert not Job.objects.exists()


def test_an_unknown_scenario_is_refused(run_manage) -> None:  # type: ignore[no-untyped-def]
    result = run_manage("runjob", "lottery", "--json")
    assert result.returncode == 2
    assert "invalid choice: 'lottery'" in result.stderr


def test_limits_come_from_the_environment(run_manage) -> None:  # type: ignore[no-untyped-def]
    result = run_manage(
        "runjob", "counter", "--strategy", "occ", "--writers", "3", "--json", env={"OCCVIZ_MAX_WRITERS": "2"}
    )
    assert result.returncode == 2
    assert "--writers: At most 2 writers (the OCCVIZ_MAX_WRITERS limit)." in result.stderr
    assert not Job.objects.exists()


LEADER_KEYS = {
    "id",
    "scenario",
    "duration_s",
    "invariant_ok",
    "invariant",
    "replicas",
    "transitions",
    "leaders",
    "failovers",
    "max_leaders_at_once",
    "renewals",
    "acquire_attempts",
    "conflicts",
    "fenced_writes_rejected",
    "fenced_writes_landed",
}
CLASSROOM = ["--replicas", "3", "--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5"]


@pytest.mark.slow
def test_runjob_leader_election_kills_the_leader_and_reports_the_failover(run_manage) -> None:  # type: ignore[no-untyped-def]
    result = run_manage("runjob", "leader-election", *CLASSROOM, "--seconds", "9", "--kill-leader-at", "3", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary.keys() >= LEADER_KEYS
    assert summary["replicas"] == 3 and summary["max_leaders_at_once"] == 1
    assert summary["fenced_writes_landed"] == 0
    (failover,) = summary["failovers"]
    assert failover.keys() >= {"cause", "at_s", "new_leader_after_s", "bound_s"}
    assert failover["cause"] == "kill" and failover["new_leader_after_s"] <= failover["bound_s"]
    assert summary["transitions"] == 2
    assert summary["leaders"][0]["identity"].startswith("replica-")
    assert summary["leaders"][0].keys() >= {"identity", "from_s", "to_s"}
    assert summary["invariant_ok"] is True, summary["invariant"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--replicas", "0"], "--replicas: Ensure this value is greater than or equal to 1"),
        (
            ["--lease-duration", "3", "--renew-deadline", "3", "--retry-period", "0.5"],
            "--lease-duration: leaseDuration must be greater than renewDeadline",
        ),
        (
            ["--lease-duration", "3", "--renew-deadline", "0.5", "--retry-period", "0.5"],
            "--renew-deadline: renewDeadline must be greater than retryPeriod*JitterFactor",
        ),
        (
            ["--replicas", "3", "--skew", "replica-9=30"],
            "--skew: unknown replica 'replica-9': the job has replicas 1 to 3",
        ),
        (["--skew", "replica-2=soon"], "'replica-2=soon' is not REPLICA=SECONDS"),
        (["--seconds", "5", "--kill-leader-at", "7"], "--kill-leader-at: 7 s is not within the 5 s the election runs"),
        (["--pause-for", "4"], "--pause-for: Give the moment of the pause too"),
        (["--replicas", "٣"], "invalid int value: '٣'"),
    ],
)
def test_leader_election_bad_flags_are_refused_and_create_no_job(run_manage, flags, message) -> None:  # type: ignore[no-untyped-def]
    result = run_manage("runjob", "leader-election", *flags, "--json")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert not Job.objects.exists()


def test_soak_runs_seeded_random_jobs_and_checks_each(run_manage) -> None:  # type: ignore[no-untyped-def]
    first = run_manage("soak", "--jobs", "6", "--seed", "11")
    assert first.returncode == 0, first.stderr
    assert "soak: 6 jobs, seed 11" in first.stdout and "0 violations" in first.stdout
    again = run_manage("soak", "--jobs", "6", "--seed", "11")
    # The same seed draws the same jobs: their parameters are recorded like any job's.
    params = [job.params for job in Job.objects.order_by("pk")]
    assert params[:6] == params[6:12]
    assert again.returncode == 0
