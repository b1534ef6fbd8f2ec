"""A leader-election job: its Lease and guarded counter, its replicas and their controls, and its live state.

Failure controls come from the job's parameters (timed, as `runjob --kill-leader-at 5`) and
from the job page's buttons while it runs. A student's client writing the job's Lease over
the API is followed on a lane of its own, as one more contender.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from occviz.scenarios.base import State
from occviz.scenarios.leader_election.actors import LeaderElection, TimedControl, create_objects
from occviz.scenarios.leader_election.elector import Habits, LeaderElectionConfig, identity
from occviz.scenarios.leader_election.summary import describe_failover, read_events, summarize
from occviz.scenarios.network import apply_latency_control, job_network
from occviz.scenarios.outside import outside_write, written_at
from occviz.store.models import Lease

if TYPE_CHECKING:
    from occviz.jobs.context import JobContext

ADDED_REPLICAS = 4
"""Replicas a job's connection budget leaves room for beyond its own ("add a replica" while it runs)."""

# The elections running in this process, by job: their replicas' beliefs are the live state.
_running: dict[int, LeaderElection] = {}
_running_lock = threading.Lock()


def _config(params: Mapping[str, Any]) -> LeaderElectionConfig:
    return LeaderElectionConfig(
        params["lease_duration"], params["renew_deadline"], params["retry_period"], bool(params["release_on_cancel"])
    )


def _timed_controls(params: Mapping[str, Any]) -> list[TimedControl]:
    controls = []
    if params.get("kill_leader_at") is not None:
        controls.append(TimedControl("kill", params["kill_leader_at"]))
    if params.get("stop_leader_at") is not None:
        controls.append(TimedControl("stop", params["stop_leader_at"]))
    if params.get("pause_leader_at") is not None:
        controls.append(TimedControl("pause", params["pause_leader_at"], seconds=params["pause_for"]))
    if params.get("cut_off_leader_at") is not None:
        controls.append(TimedControl("cut_off", params["cut_off_leader_at"], seconds=params["cut_off_for"]))
    every = params.get("starve_leader_every")
    if every:
        # Bursts: whoever leads at each moment is starved (the node's noisy neighbour stays).
        count = math.ceil(params["seconds"] / every) - 1  # the bursts that begin before the end
        controls += [TimedControl("starve", every * n, seconds=params["starve_for"]) for n in range(1, count + 1)]
    return controls


def _habits(params: Mapping[str, Any]) -> Habits:
    return Habits(
        fencing=not params.get("no_fencing"),
        work_after_loss_s=params.get("work_after_loss") or 0.0,
        shutdown_s=params.get("shutdown_for") or 0.0,
    )


def _lease_durations(params: Mapping[str, Any]) -> dict[int, float]:
    pairs = (word.split("=") for word in (params.get("lease_durations") or "").split())
    return {int(name.removeprefix("replica-")): float(seconds) for name, seconds in pairs}


def replicas_as_processes(params: Mapping[str, Any]) -> bool:
    """Whether each replica runs in a process of its own (the default; jobs made before the choice did too)."""
    return params.get("replicas_as", "processes") != "threads"


def is_incident(params: Mapping[str, Any]) -> bool:
    """Whether the job's replicas were made to misbehave as in an incident from the field."""
    return any(
        params.get(name)
        for name in ("no_fencing", "work_after_loss", "shutdown_for", "lease_durations", "starve_leader_every")
    )


def _skews(params: Mapping[str, Any]) -> list[tuple[int, float]]:
    pairs = (word.split("=") for word in (params.get("skew") or "").split())
    return [(int(name.removeprefix("replica-")), float(seconds)) for name, seconds in pairs]


_TAKEN_DOWN = {
    "killed": "was killed",
    "stopped": "was stopped",
    "paused": "was paused",
    "cut_off": "was cut off",
    "starved": "was starved of CPU",
}


class FailoverNarrator:
    """Records as the election does, and tells the acquisition after a leader was taken down how long it took.

    "replica-3 acquired the lease (transition 2), 2.6 s after replica-1 was killed": the
    sentence a class waits for, said the moment it happens rather than in the summary.
    """

    def __init__(self, context: JobContext) -> None:
        self.recorder = context.recorder
        self._down: tuple[float, str] | None = None  # (ms, "replica-1 was killed")
        self._lock = threading.Lock()

    def __call__(self, actor: int, op: int, attempt: int, kind: str, row: int | None = None, **fields: Any) -> None:
        detail = fields.get("detail") or {}
        with self._lock:
            if kind in _TAKEN_DOWN and detail.get("leading"):
                who = identity(actor) + (f" (process {detail['pid']})" if detail.get("pid") else "")
                self._down = (self.recorder.now_ms(), f"{who} {_TAKEN_DOWN[kind]}")
            elif kind == "acquired" and self._down is not None:
                at_ms, what = self._down
                self._down = None
                fields["detail"] = {
                    **detail,
                    "after_s": round((self.recorder.now_ms() - at_ms) / 1000, 1),
                    "after": what,
                }
        self.recorder.record(actor, op, attempt, kind, row, **fields)


def run(context: JobContext) -> dict[str, Any]:
    job, params = context.job, context.params
    config = _config(params)
    lease, counter = create_objects(f"job-{job.pk}", job=job)
    seed = params["seed"] if params.get("seed") is not None else random.randrange(2**32)
    # Each replica's proxy (cut off's) adds the latency asked for, changeable while it runs.
    network = job_network(params, seed, always=True)
    election = LeaderElection(
        lease_id=lease.pk,
        counter_id=counter.pk,
        replicas=params["replicas"],
        record=FailoverNarrator(context),
        stop=context.stop,
        config=config,
        seed=seed,
        habits=_habits(params),
        lease_durations=_lease_durations(params),
        processes=replicas_as_processes(params),
        network=network,
    )
    # Skews apply as the replicas are released; the failures at their moments.
    skews = [TimedControl("skew", 0.0, replica=replica, seconds=seconds) for replica, seconds in _skews(params)]
    election.schedule(*skews, *_timed_controls(params))

    def control(action: str, actor: int | None, seconds: float | None) -> None:
        try:
            # The job was given connections for this many more replicas (its budget), no more.
            if action == "add" and len(election.replicas) >= params["replicas"] + ADDED_REPLICAS:
                raise ValueError(
                    f"A job may add at most {ADDED_REPLICAS} replicas to the {params['replicas']} it began with."
                )
            if action == "latency":
                apply_latency_control(context, network, action, seconds)
                return
            election.apply(TimedControl(action, 0.0, replica=actor, seconds=seconds or 0.0))  # type: ignore[arg-type]
        except ValueError as refused:
            context.recorder.record(
                actor or 0, 0, 0, "control_failed", detail={"control": action, "error": str(refused)}
            )
            raise

    context.on_control(control)
    replicas = {identity(n) for n in range(1, params["replicas"] + ADDED_REPLICAS + 1)}
    context.on_outside_write(
        lambda payload: record_outside_write(context, lease.pk, replicas, payload),
        next_actor=election.reserve_number,
    )
    with _running_lock:
        _running[job.pk] = election
    try:
        election.run(params["seconds"], run_actors=context.run_actors)
        # Not context.elapsed_s, which ends with the initial replicas: the election outlives
        # them when they were killed or stopped and others added (it lasts its seconds).
        duration_s = context.recorder.now_ms() / 1000.0
        # The Lease locked while the last outside writes are recorded: the transitions it
        # counts and the events' then agree.
        with context.settling(lambda: Lease.objects.select_for_update().filter(pk=lease.pk).exists()):
            context.settle_outside_writes()
        # Stored while the election is still this job's state: the last snapshot shows each replica as it ended.
        context.recorder.flush()
    finally:
        with _running_lock:
            _running.pop(job.pk, None)
    summary = summarize(
        read_events(job.pk),
        Lease.objects.get(pk=lease.pk),
        config,
        replicas=len(election.replicas),
        incident=is_incident(params),
        fencing=not params.get("no_fencing"),
    )
    summary["failovers_in_words"] = [describe_failover(failover) for failover in summary["failovers"]]
    summary["duration_s"] = round(duration_s, 4)
    summary["seed"] = seed
    summary["network"] = network.describe()
    return summary


def record_outside_write(context: JobContext, lease_id: int, replicas: set[str], payload: Mapping[str, Any]) -> None:
    """A write to the job's Lease from outside (a student's client through the API), as a replica's would read.

    Its lane is named by the holderIdentity it wrote (its client's identity), or by the
    writer for a release or a name a replica has. Taking the lease from another holder is
    `acquired` (transition N), writing it again as its holder `renewed`, emptying it
    `released`, a stale resourceVersion `conflict`: the kinds the replicas record, so the
    leadership bands, the failover figures and the invariant count it as one of them.
    """
    if payload.get("resource") != "leases" or payload.get("object_id") != lease_id:
        return
    before, after = payload.get("before") or {}, payload.get("after") or {}
    holder, held_by = after.get("holder_identity") or "", before.get("holder_identity") or ""
    lane = holder or (held_by if held_by in context.outside_lanes else None)
    if lane in replicas:
        lane = None  # an outside writer that calls itself replica-2 is not replica-2
    write = outside_write(context, payload, lane)
    detail = dict(write.detail)
    lease_s = after.get("lease_duration_seconds")
    fields: dict[str, Any] = {"version_read": write.version_read, "value_read": before.get("lease_transitions")}
    if write.type == "CONFLICT":
        detail.update(phase="renew" if holder and holder == held_by else "acquire")
        fields["value_written"] = after.get("lease_transitions")
        context.recorder.record(write.actor, 0, 1, "conflict", lease_id, detail=detail, **fields)
        return
    if write.type != "MODIFIED":
        return  # a deleted Lease ends the election's objects, not a lane's leadership
    detail.update(db_time=written_at(payload), lease_s=lease_s)
    fields.update(version_written=write.version_written, value_written=after.get("lease_transitions"))
    if not holder:
        kind = "released"
    elif holder == held_by:
        kind = "renewed"
    else:
        kind = "acquired"
        if held_by:
            detail["holder"] = held_by
    context.recorder.record(write.actor, 0, 1, kind, lease_id, detail=detail, **fields)


def _lease_manifest(lease: Lease) -> dict[str, Any]:
    """The Lease as `kubectl get lease <name> -o yaml` shows it."""

    def micro(value: Any) -> str | None:
        return None if value is None else value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": lease.name, "namespace": lease.namespace, "resourceVersion": str(lease.resource_version)},
        "spec": {
            "holderIdentity": lease.holder_identity or None,
            "leaseDurationSeconds": lease.lease_duration_seconds,
            "acquireTime": micro(lease.acquire_time),
            "renewTime": micro(lease.renew_time),
            "leaseTransitions": lease.lease_transitions,
        },
    }


def _replica_states(election: LeaderElection) -> list[dict[str, Any]]:
    now = time.monotonic()
    states = []
    for number in election.replicas:
        elector = election.elector(number)
        if elector.killed:
            status = "killed"
        elif elector.stop_requested or elector.finished:
            status = "stopped"
        elif elector.paused:
            status = "paused"
        elif elector.proxy is not None and elector.proxy.is_cut:
            status = "cut off"
        else:
            status = "running"
        timer = None
        holder, expiry = elector.observed_holder, elector.observed_expiry
        if status in ("running", "paused", "cut off") and holder and expiry is not None:
            timer = round(max(0.0, expiry - now), 1)
        states.append(
            {
                "number": number,
                "name": elector.identity,
                "leading": bool(elector.leading and status not in ("killed", "stopped")),
                "token": elector.token,
                "status": status,
                "holder_seen": holder,
                "timer_s": timer,
                "skew_s": elector.clock_offset_s or None,
                "pid": getattr(elector, "pid", None),
            }
        )
    return states


def read_state(job_id: int, params: Mapping[str, Any]) -> State:
    """The Lease as it is now and, where the election runs in this process, what each replica believes."""
    lease = Lease.objects.filter(job_id=job_id, name="leader").first()
    if lease is None:
        return State({"lease": None, "replicas": []}, {"transitions": None, "leading": None})
    with _running_lock:
        election = _running.get(job_id)
    replicas = _replica_states(election) if election is not None else []
    leading = sum(1 for replica in replicas if replica["leading"]) if election is not None else None
    return State(
        {"lease": _lease_manifest(lease), "replicas": replicas},
        {"transitions": lease.lease_transitions, "leading": leading},
    )
