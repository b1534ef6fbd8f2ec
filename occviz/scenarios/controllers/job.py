"""A controller race job: its Deployment, its controllers, the outside writes it follows, and its live state.

Writes to the Deployment from outside the job (a student's `kubectl edit` or `replace`,
the admin) are followed: each is a version of the history on a lane named after its
writer, and a controller's field it changes is counted as erased from outside, apart
from what the controllers erased of one another.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import connection

from occviz.concurrency.latency import Network
from occviz.concurrency.retry import make_policy
from occviz.concurrency.writer import ActorContext, connected
from occviz.jobs import shared
from occviz.jobs.models import Job
from occviz.jobs.shards import processes_of
from occviz.scenarios.base import State
from occviz.scenarios.controllers.actors import Controller
from occviz.scenarios.controllers.deployment import (
    COLUMNS,
    FIELDS,
    MIN_CONTROLLERS,
    OBJECT_NAME,
    controller_name,
    initial_content,
)
from occviz.scenarios.controllers.history import Acknowledge, Erasure, History
from occviz.scenarios.controllers.summary import summarize
from occviz.scenarios.network import apply_latency_control, job_network, shard_network
from occviz.scenarios.outside import Payload, outside_write
from occviz.store.models import Deployment

if TYPE_CHECKING:
    from occviz.jobs.context import Actor, JobContext
    from occviz.jobs.recorder import EventRecorder

# The controllers' histories while their jobs run in this process: the live state's last writes.
_running: dict[int, History] = {}
_running_lock = threading.Lock()


def _controllers(
    context: JobContext, row: int, seed: int, acknowledging: Callable[[ActorContext], Acknowledge], network: Network
) -> list[Actor]:
    """The job's controllers, 1..N, on the Deployment `row`; each hands its acknowledged writes to `acknowledging`."""
    params = context.params
    count = int(params["controllers"])
    policy = make_policy(params["retry"], params.get("max_attempts"))
    seconds = float(params["seconds"])
    interval_s = 1.0 / float(params["rate_per_s"])

    def controller_actor(number: int) -> Actor:
        def act(ready: Callable[[], object]) -> None:
            writer = ActorContext(
                number=number,
                record_step=context.recorder.record,
                policy=policy,
                think_ms=float(params["think_ms"] or 0),
                stop=context.stop,
                rng=random.Random(seed * 1_000 + number),
            )
            with connected(writer, **network.connection(number)):
                ready()
                controller = Controller(
                    writer, FIELDS[number - 1], row, count, acknowledging(writer), blind=params["strategy"] == "none"
                )
                controller.run(seconds, interval_s, context.stop)

        return act

    return [controller_actor(n) for n in range(1, count + 1)]


def run(context: JobContext) -> dict[str, Any]:
    job, params = context.job, context.params
    count = int(params["controllers"])
    content = initial_content(count)
    deployment = Deployment.objects.create(namespace=f"job-{job.pk}", name=OBJECT_NAME, job=job, **content)
    history = History(
        deployment.resource_version,
        [owned.get(content) for owned in FIELDS[:count]],
        on_erased=_recorder_of_erasures(context.recorder, deployment.pk, count, context.outside_lanes),
    )
    lanes = iter(range(count + 1, 2**31))
    context.on_outside_write(
        lambda payload: record_outside_write(context, deployment.pk, history, payload), next_actor=lanes.__next__
    )
    seed = params["seed"] if params.get("seed") is not None else random.randrange(2**32)
    seconds = float(params["seconds"])
    # Each controller's road to the server: direct, or through the job's proxy a latency away (changeable live).
    network = job_network(params, seed)
    context.on_control(lambda action, actor, seconds: apply_latency_control(context, network, action, seconds))
    follower: AckFollower | None = None
    acknowledging: Callable[[ActorContext], Acknowledge] = lambda writer: history  # noqa: E731
    if processes_of(params) > 1:
        # Controllers in other processes: every acknowledged write goes through PostgreSQL, followed here.
        follower = AckFollower(job.pk, history)
        acknowledging = lambda writer: StoredAcks(job.pk, writer)  # noqa: E731

    with _running_lock:
        _running[job.pk] = history
    try:
        if follower is not None:
            follower.start()
        try:
            controllers = _controllers(context, deployment.pk, seed, acknowledging, network)
            context.run_actors(controllers, time_limit_s=seconds, plan={"seed": seed})
        finally:
            network.close()
            if follower is not None:
                follower.stop()  # every shard has ended: each write it acknowledged is stored, and followed now
        # The object locked while the last outside writes are handed over: the history then ends where it does.
        with context.settling(
            lambda: list(Deployment.objects.filter(pk=deployment.pk).select_for_update().values_list("pk"))
        ):
            context.settle_outside_writes()
        # Taken while the history is still this job's state: the last snapshot shows the controllers as they ended.
        figures = context.final_figures()
    finally:
        with _running_lock:
            _running.pop(job.pk, None)
    summary = summarize(job, params, figures, deployment.pk, history, context.elapsed_s, seed)
    return {**summary, "network": network.describe()}


def shard_actors(context: JobContext, plan: Mapping[str, Any]) -> list[Actor]:
    """In a shard of a job over several processes: its controllers again, their writes acknowledged in PostgreSQL."""
    row = Deployment.objects.filter(job_id=context.job.pk, name=OBJECT_NAME).values_list("pk", flat=True).get()
    job_id, seed = context.job.pk, int(plan["seed"])
    network = shard_network(context, seed)
    return _controllers(context, row, seed, lambda writer: StoredAcks(job_id, writer), network)


_ACK = "ack:"
_LAST_WRITES = "last_writes"
FOLLOW_INTERVAL_S = 0.01


@dataclass
class StoredAcks:
    """A controller's acknowledged writes, stored for the coordinator's history (a job over several processes)."""

    job_id: int
    writer: ActorContext

    def acknowledge(self, actor: int, op: int, version_read: int, version: int, values: tuple[int, ...]) -> None:
        entry = {"actor": actor, "op": op, "version_read": version_read, "values": list(values)}
        self.writer.cursor.one(
            "INSERT INTO jobs_jobshared (job_id, name, number, data) VALUES (%s, %s, %s, CAST(%s AS text)::jsonb)",
            [self.job_id, f"{_ACK}{version}", version, json.dumps(entry)],
        )


class AckFollower:
    """The coordinator's: the controllers' stored writes handed to the job's history, in whatever order they land.

    Each write it applied moves the controllers' last writes, published for the live state read in
    the other processes (`read_state`).
    """

    def __init__(self, job_id: int, history: History) -> None:
        self.job_id = job_id
        self.history = history
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"job-{job_id}-acks", daemon=True)
        self._published: object = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.follow()  # the last writes, stored before their shards ended

    def _run(self) -> None:
        try:
            while not self._stop.wait(FOLLOW_INTERVAL_S):
                self.follow()
        finally:
            connection.close()

    def follow(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT number, data FROM jobs_jobshared WHERE job_id = %s AND starts_with(name, %s) "
                "AND number > %s ORDER BY number",
                [self.job_id, _ACK, self.history.version],
            )
            rows = cursor.fetchall()
        for version, entry in rows:
            if version <= self.history.version:
                continue  # read again while it waited for an earlier version, and applied since: handed over once
            entry = json.loads(entry) if isinstance(entry, str) else entry
            values = tuple(entry["values"])
            self.history.acknowledge(entry["actor"], entry["op"], entry["version_read"], int(version), values)
        last = self.history.last_writes()
        if last != self._published:
            shared.put(self.job_id, _LAST_WRITES, data=last)
            self._published = last


def _recorder_of_erasures(
    recorder: EventRecorder, row: int, controllers: int, lanes: Mapping[str, int]
) -> Callable[[Erasure], None]:
    """Each lost write as an `erased` event, or `outside_erased` on the lane of the outside writer who erased it."""

    def record(erasure: Erasure) -> None:
        outside = erasure.eraser > controllers
        lane = next((name for name, number in lanes.items() if number == erasure.eraser), "") if outside else ""
        recorder.record(
            erasure.eraser,
            erasure.op,
            1,
            "outside_erased" if outside else "erased",
            row,
            version_read=erasure.version_read,
            version_written=erasure.version,
            value_read=erasure.erased_value,
            value_written=erasure.restored_value,
            detail={
                "victim": controller_name(erasure.victim),
                "victim_actor": erasure.victim,
                "field": FIELDS[erasure.victim - 1].path,
                "set_at": erasure.set_at,
                **({"lane": lane} if lane else {}),
            },
        )

    return record


def record_outside_write(context: JobContext, row: int, history: History, payload: Payload) -> None:
    """A write to the job's Deployment from outside (kubectl, the admin): a version of the history, on its lane.

    Its values go into the history like a controller's write, so a controller's field it
    changes is erased from outside (an `outside_erased` event), and the replay stays exact.
    """
    if payload.get("resource") != Deployment.kind_plural or payload.get("object_id") != row:
        return
    write = outside_write(context, payload)
    count = len(history.values)
    before = [owned.get(write.before) for owned in FIELDS[:count]]
    after = tuple(owned.get(write.after) for owned in FIELDS[:count])
    detail = dict(write.detail)
    if write.type == "MODIFIED" and write.version_written is not None:
        changed = [FIELDS[i].path for i in range(count) if before[i] != after[i]]
        detail["changed"] = ", ".join(changed) if changed else "no controller's field"
        context.recorder.record(
            write.actor,
            0,
            1,
            "outside_write",
            row,
            version_read=write.version_read,
            version_written=write.version_written,
            detail=detail,
        )
        history.acknowledge(write.actor, 0, write.version_read or 0, write.version_written, after)
    elif write.type == "CONFLICT":
        context.recorder.record(
            write.actor, 0, 1, "outside_conflict", row, version_read=write.version_read, detail=detail
        )
    elif write.type == "DELETED":
        context.recorder.record(
            write.actor, 0, 1, "outside_deleted", row, version_read=write.version_read, detail=detail
        )


def read_state(job_id: int, params: Mapping[str, Any]) -> State:
    """The Deployment as stored now and, per controller, its field on it and its last acknowledged write."""
    deployment = Deployment.objects.filter(job_id=job_id, name=OBJECT_NAME).first()
    if deployment is None:
        return State({"deployment": None, "controllers": []})
    count = int(params.get("controllers") or MIN_CONTROLLERS)
    content = {column: getattr(deployment, column) for column in COLUMNS}
    with _running_lock:
        history = _running.get(job_id)
    last_writes = history.last_writes() if history is not None else []
    if history is None and processes_of(params) > 1:
        # Read in another process of the job than its history's: the last writes it published.
        last_writes = [tuple(entry) for entry in shared.data(job_id, _LAST_WRITES) or []]
    ended: dict[str, dict[str, Any]] = {}
    if history is None and not last_writes:
        summary = Job.objects.filter(pk=job_id).values_list("summary", flat=True).first() or {}
        ended = {entry["controller"]: entry for entry in summary.get("per_controller", [])}
    rows = []
    for number in range(1, count + 1):
        name = controller_name(number)
        row: dict[str, Any] = {
            "number": number,
            "name": name,
            "field": FIELDS[number - 1].path,
            "on_object": FIELDS[number - 1].get(content),
        }
        if last_writes:
            row["last_value"], row["last_version"], row["lost"] = last_writes[number - 1]
        elif name in ended:
            row.update({key: ended[name][key] for key in ("last_value", "last_version", "lost")})
        rows.append(row)
    manifest = {
        "name": deployment.name,
        "namespace": deployment.namespace,
        "resourceVersion": deployment.resource_version,
        "labels": deployment.labels,
        "annotations": deployment.annotations,
        "replicas": deployment.replicas,
        "status": deployment.status,
    }
    return State({"deployment": manifest, "controllers": rows})
