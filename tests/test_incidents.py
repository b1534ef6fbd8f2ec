"""Incidents from the field, as leader-election presets run by `runjob --preset`, and their damage recomputed.

Each preset runs as a user runs it (a child `manage.py runjob leader-election --preset NAME`,
its timings shrunk with flags that override the preset's), on real replicas contending for a
real Lease. The test then exports the job's events as the page's export does and recomputes,
with its own arithmetic on the database's clock recorded in each event, how long two replicas
acted as leader and how many writes landed from a replica that was not the Lease's holder.
"""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils.html import escape

from occviz.jobs.models import Job

pytestmark = pytest.mark.django_db(transaction=True)

# A 1 s lease renewed every 0.125 s: the incidents play out in a few seconds.
FAST = ("--lease-duration", "1", "--renew-deadline", "0.75", "--retry-period", "0.125")

INCIDENTS = (
    "acting-after-loss",
    "acting-after-loss-fenced",
    "slow-shutdown",
    "mixed-lease-durations",
    "cpu-starved-leader",
)
_ACTS = ("acquired", "renewed", "released", "guarded_write", "fenced")
_LEASE_WRITES = ("acquired", "renewed", "released")


def run_preset(run_manage: Any, preset: str, *flags: str) -> tuple[Job, dict[str, Any]]:
    result = run_manage("runjob", "leader-election", "--preset", preset, *flags, "--json", timeout=60)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    return Job.objects.get(), summary


def exported(client: Client, job: Job) -> list[dict[str, Any]]:
    response = client.get(f"/jobs/{job.pk}/export.jsonl")
    assert response.status_code == 200
    body = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    return [json.loads(line) for line in body.splitlines()]


def acts_by_db_clock(events: list[dict[str, Any]]) -> list[tuple[datetime, int, str]]:
    acts = [
        (datetime.fromisoformat(e["detail"]["db_time"]), e["actor"], e["kind"])
        for e in events
        if e["kind"] in _ACTS and (e["detail"] or {}).get("db_time")
    ]
    return sorted(acts)


def two_leaders_s(events: list[dict[str, Any]]) -> float:
    """Seconds during which two replicas acted as leader: each from its acquisition to its last act before the next."""
    spans: dict[int, list[list[datetime]]] = {}
    for at, actor, kind in acts_by_db_clock(events):
        if kind == "acquired":
            spans.setdefault(actor, []).append([at, at])
        elif spans.get(actor):
            spans[actor][-1][1] = at
    intervals = [span for actor_spans in spans.values() for span in actor_spans]
    # Walk every moment where some interval starts or ends, and add up the pieces covered twice.
    moments = sorted({moment for span in intervals for moment in span})
    total = timedelta()
    for start, end in itertools.pairwise(moments):
        covering = sum(1 for since, until in intervals if since <= start and end <= until)
        if covering >= 2:
            total += end - start
    return total.total_seconds()


def writes_by_non_holder(events: list[dict[str, Any]]) -> tuple[int, int]:
    """(landed, fenced) guarded writes by a replica the Lease did not name last, by the database's clock."""
    holder = None
    landed = fenced = 0
    for _, actor, kind in acts_by_db_clock(events):
        if kind in _LEASE_WRITES:
            holder = None if kind == "released" else actor
        elif actor != holder:
            landed += kind == "guarded_write"
            fenced += kind == "fenced"
    return landed, fenced


def assert_damage_recomputed(summary: dict[str, Any], events: list[dict[str, Any]]) -> tuple[float, int, int]:
    split_s = two_leaders_s(events)
    landed, fenced = writes_by_non_holder(events)
    assert summary["split_brain_s"] == pytest.approx(split_s, abs=0.0011)
    assert summary["non_leader_writes_landed"] == landed
    assert summary["non_leader_writes_fenced"] == fenced
    return split_s, landed, fenced


@pytest.mark.slow
def test_acting_after_loss_writes_land_next_to_the_new_leaders(run_manage: Any, signed_in: Client) -> None:
    job, summary = run_preset(
        run_manage, "acting-after-loss", *FAST, "--seconds", "5", "--pause-leader-at", "1", "--pause-for", "2",
        "--work-after-loss", "1.5",
    )  # fmt: skip
    assert job.params["work_after_loss"] == 1.5 and job.params["no_fencing"] is True
    events = exported(signed_in, job)
    split_s, landed, _ = assert_damage_recomputed(summary, events)
    assert split_s > 1.0
    assert landed > 3  # the woken write, then one every RetryPeriod of the 1.5 s it works on
    assert any(e["kind"] == "working_on" for e in events)
    assert summary["invariant_ok"], summary["invariant"]
    assert f"two leaders for {summary['split_brain_s']:.1f} s" in summary["invariant"]
    assert f"{landed} writes by a replica that was not leading landed" in summary["invariant"]


@pytest.mark.slow
def test_acting_after_loss_fenced_rejects_every_write_of_the_old_leader(run_manage: Any, signed_in: Client) -> None:
    job, summary = run_preset(
        run_manage, "acting-after-loss-fenced", *FAST, "--seconds", "5", "--pause-leader-at", "1", "--pause-for", "2",
        "--work-after-loss", "1.5",
    )  # fmt: skip
    events = exported(signed_in, job)
    split_s, landed, fenced = assert_damage_recomputed(summary, events)
    assert split_s > 1.0
    assert landed == 0
    assert fenced > 3
    assert summary["fenced_writes_rejected"] >= fenced
    assert summary["invariant_ok"], summary["invariant"]
    assert f"{fenced} writes by a replica that was not leading fenced" in summary["invariant"]


@pytest.mark.slow
def test_slow_shutdown_writes_on_after_the_next_leader_started(run_manage: Any, signed_in: Client) -> None:
    job, summary = run_preset(
        run_manage, "slow-shutdown", *FAST, "--seconds", "5", "--stop-leader-at", "1", "--shutdown-for", "2.5"
    )
    events = exported(signed_in, job)
    split_s, landed, _ = assert_damage_recomputed(summary, events)
    assert split_s > 0.5
    assert landed > 2
    stopped = next(e["actor"] for e in events if e["kind"] == "stopped")
    # Its release came after another replica took the lease: it released nothing.
    assert not any(e["kind"] == "released" and e["actor"] == stopped for e in events)
    assert summary["invariant_ok"], summary["invariant"]


@pytest.mark.slow
def test_mixed_lease_durations_make_two_leaders(run_manage: Any, signed_in: Client) -> None:
    job, summary = run_preset(
        run_manage, "mixed-lease-durations", "--lease-duration", "2", "--renew-deadline", "1.5",
        "--retry-period", "0.5", "--lease-durations", "replica-3=0.25", "--seconds", "4",
    )  # fmt: skip
    events = exported(signed_in, job)
    split_s, landed, _ = assert_damage_recomputed(summary, events)
    first = next(e for e in events if e["kind"] == "acquired")
    assert first["actor"] != 3  # it joins one RetryPeriod late, next to a leader already elected
    taken = next(e for e in events if e["kind"] == "acquired" and e["actor"] == 3)
    assert taken["detail"]["holder"] == f"replica-{first['actor']}"  # taken while that lease was valid
    assert taken["detail"]["lease_s"] == 0.25
    assert split_s > 0.5
    assert landed >= 1
    assert summary["max_leaders_at_once"] == 2
    assert summary["invariant_ok"], summary["invariant"]


@pytest.mark.slow
def test_cpu_starved_leader_hands_over_at_each_burst(run_manage: Any, signed_in: Client) -> None:
    job, summary = run_preset(
        run_manage, "cpu-starved-leader", *FAST, "--seconds", "7.4", "--starve-leader-every", "2.5",
        "--starve-for", "1.75",
    )  # fmt: skip
    events = exported(signed_in, job)
    split_s, landed, _ = assert_damage_recomputed(summary, events)
    assert split_s == 0 and landed == 0  # it steps down before anyone else leads: the damage is the churn
    starved = [e for e in events if e["kind"] == "starved"]
    assert len(starved) == 2
    for burst in starved:
        after = [e for e in events if e["seq"] > burst["seq"]]
        assert next(e for e in after if e["actor"] == burst["actor"] and e["kind"] in ("lost", "acquired"))["kind"] == (
            "lost"
        )
    transitions = {e["value_written"] for e in events if e["kind"] == "acquired"}
    assert summary["transitions"] == len(transitions) == 3
    assert [f["cause"] for f in summary["failovers"]] == ["starvation", "starvation"]
    assert all(f["within_bound"] for f in summary["failovers"])
    assert summary["invariant_ok"], summary["invariant"]
    step_downs = sum(1 for e in events if e["kind"] == "lost")
    assert step_downs == 2
    assert "2 leaders stepped down; 3 lease transitions" in summary["invariant"]


@pytest.mark.slow
def test_a_preset_with_an_overriding_flag(run_manage: Any) -> None:
    result = run_manage(
        "runjob", "leader-election", "--preset", "kill-the-leader", "--seconds", "1", "--kill-leader-at", "0.5",
        "--replicas", "2", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    job = Job.objects.get()
    # The preset's timings, the flags' replicas, length and kill.
    assert (job.params["lease_duration"], job.params["retry_period"]) == (3, 0.5)
    assert (job.params["replicas"], job.params["seconds"], job.params["kill_leader_at"]) == (2, 1, 0.5)
    assert json.loads(result.stdout)["replicas"] == 2


@pytest.mark.slow
def test_a_preset_gives_a_required_flag(run_manage: Any) -> None:
    result = run_manage("runjob", "counter", "--preset", "lost-update-demo", "--seconds", "1", "--writers", "2")
    assert result.returncode == 0, result.stderr
    assert Job.objects.get().params["strategy"] == "none"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["leader-election", "--preset", "split-brain"], "unknown preset 'split-brain' for leader-election: its "),
        (["counter", "--strategy", "occ", "--preset", "nope"], "lost-update-demo"),
        (["counter"], "the following arguments are required: --strategy"),
    ],
)
def test_an_unknown_preset_is_refused_with_the_names_and_no_job(run_manage: Any, args: list[str], message: str) -> None:
    result = run_manage("runjob", *args, "--json")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "acting-after-loss-fenced" in result.stderr or args[0] == "counter"
    assert result.stdout == ""
    assert not Job.objects.exists()


def test_each_incident_tells_its_story_in_two_sentences_on_the_launch_page(signed_in: Client) -> None:
    from occviz.scenarios.leader_election.scenario import scenario

    for slug in INCIDENTS:
        preset = next(p for p in scenario.presets if p.slug == slug)
        assert preset.teaches.count(". ") == 1 and preset.teaches.endswith("."), preset.teaches
        page = signed_in.get(f"/jobs/new/leader-election/?preset={slug}").content.decode()
        assert escape(preset.teaches) in page
        assert f'data-preset="{slug}"' in page


def test_incident_fields_refuse_bad_input() -> None:
    from occviz.scenarios.leader_election.scenario import LeaderElectionForm

    timings = {"replicas": 3, "lease_duration": 3, "renew_deadline": 2, "retry_period": 0.5, "seconds": 10}
    form = LeaderElectionForm(
        data={
            **timings,
            "lease_durations": "replica-9=1 replica-2=abc replica-1=0.01",
            "shutdown_for": 3,
            "starve_for": 2,
        }
    )
    assert not form.is_valid()
    assert form.errors["lease_durations"] == [
        "unknown replica 'replica-9': the job has replicas 1 to 3.",
        "'replica-2=abc' is not REPLICA=SECONDS (e.g. replica-2=0.5).",
        "'replica-1=0.01': a lease duration from 0.1 s to an hour.",
    ]
    assert form.errors["shutdown_for"] == ["Give the moment of the stop too (stop the leader at)."]
    assert form.errors["starve_for"] == ["Give how often too (starve the leader every)."]
    # Starved for the lease duration plus the renew deadline (5 s) by default: longer than every 4 s.
    form = LeaderElectionForm(data={**timings, "starve_leader_every": 4})
    assert not form.is_valid()
    assert form.errors["starve_for"] == ["A starvation must end before the next one (starve the leader every)."]
    form = LeaderElectionForm(data={**timings, "lease_durations": "3=0.5, replica-2=1"})
    assert form.is_valid(), form.errors
    assert form.cleaned_data["lease_durations"] == "replica-2=1 replica-3=0.5"


def test_split_brain_and_non_leader_writes_by_the_database_clock_not_the_order_recorded() -> None:
    from occviz.scenarios.leader_election.summary import non_leader_writes, split_brain_s

    def act(actor: int, kind: str, second: float) -> dict[str, Any]:
        at = datetime(2025, 1, 1) + timedelta(seconds=second)
        return {"actor": actor, "kind": kind, "detail": {"db_time": at.isoformat()}}

    events = [
        act(1, "acquired", 0.0),
        act(1, "guarded_write", 0.1),
        act(1, "renewed", 1.0),
        act(2, "acquired", 2.0),  # replica-1's lease taken while it still acts
        act(1, "guarded_write", 2.5),  # landed, by a replica the Lease no longer names
        act(2, "guarded_write", 2.6),
        act(1, "fenced", 3.0),
        act(2, "released", 4.0),
        act(2, "guarded_write", 4.5),  # after its own release: nobody holds the Lease
        act(3, "acquired", 4.6),  # after replica-2's last act: not two leaders
    ]
    # Recorded out of the database's order (threads record as they get the lock): the clock decides.
    shuffled = events[::-1]
    assert split_brain_s(shuffled) == pytest.approx(1.0)  # replica-1 from 2.0 to its fenced write at 3.0
    assert non_leader_writes(shuffled) == (2, 1)
    assert two_leaders_s(shuffled) == pytest.approx(1.0)
    assert writes_by_non_holder(shuffled) == (2, 1)
