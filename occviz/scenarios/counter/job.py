"""A counter race job: its rows, its writers, the outside writes it follows, and its rows as they are now.

Every writer increments a randomly chosen row of the job's own K rows with the chosen
strategy until its increments are done or the job's time is up (S seconds, else
OCCVIZ_MAX_SECONDS): a deadline that think time, retry waits and lock waits count against.
"""

from __future__ import annotations

import random
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection

from occviz.concurrency.latency import Network
from occviz.concurrency.retry import make_policy
from occviz.concurrency.writer import connected
from occviz.scenarios.base import State
from occviz.scenarios.counter.actors import STRATEGIES, CounterWriter, increment_until_done
from occviz.scenarios.counter.summary import OutsideTally, summarize, tally_outside, tally_rows
from occviz.scenarios.network import apply_latency_control, job_network, shard_network
from occviz.scenarios.outside import outside_write
from occviz.store.models import Counter

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from occviz.jobs.context import Actor, JobContext
    from occviz.jobs.models import Job

MAX_ROWS_SHOWN = 64
"""The contended rows shown live (the sums behind lost_updates still cover all rows)."""


def _make_rows(job: Job, params: Mapping[str, Any]) -> dict[int, str]:
    """The job's K counter rows, `row-1` to `row-K`: their names by id."""
    namespace = f"job-{job.pk}"
    counters = Counter.objects.bulk_create(
        Counter(namespace=namespace, name=f"row-{i}", value=params["initial_value"], job=job)
        for i in range(1, params["rows"] + 1)
    )
    return {counter.pk: counter.name for counter in counters}


# The outside writes of the jobs running in this process, counted as they are recorded: the state read
# after every batch needs them, and scanning every stored event's detail for them each time would grow
# with the job (its conflicts carry a detail too).
_outside: dict[int, OutsideTally] = {}
_outside_lock = threading.Lock()
# In a process running a shard of a job over several processes (not the coordinator, which records
# the outside writes): what the stored outside events say, counted on batch by batch, and up to which event.
_outside_stored: dict[int, tuple[OutsideTally, int]] = {}


def writers(context: JobContext, names: Mapping[int, str], seed: int, network: Network) -> list[Actor]:
    """The job's writers, 1..N, over its rows (`names`: each row's name by id), each `network` away."""
    params = context.params
    rows = list(names)
    policy = make_policy(
        params["retry"],
        params["max_attempts"],
        base_ms=params["base_ms"],
        factor=params["factor"],
        cap_ms=params["cap_ms"],
    )
    increment = STRATEGIES[params["strategy"]]
    limit_s = float(params["seconds"] or settings.OCCVIZ_MAX_SECONDS)
    conflict_details = {pk: {"name": name} for pk, name in names.items()}

    def writer_actor(number: int) -> Actor:
        def act(ready: Callable[[], object]) -> None:
            writer = CounterWriter(
                number=number,
                record_step=context.recorder.record,
                policy=policy,
                think_ms=params["think_ms"],
                stop=context.stop,
                rng=random.Random(seed * 1_000 + number),
                lock_mode=params["lock"],
                isolation=params["isolation"],
                names=conflict_details,
            )
            with connected(writer, **network.connection(number)):
                ready()
                writer.deadline = time.perf_counter() + limit_s
                increment_until_done(writer, rows, increment, params["increments"], context.request_stop)

        return act

    return [writer_actor(n) for n in range(1, params["writers"] + 1)]


def shard_actors(context: JobContext, plan: Mapping[str, Any]) -> list[Actor]:
    """In a shard of a job over several processes: its writers again, over its rows as the coordinator made them."""
    names = dict(Counter.objects.filter(job_id=context.job.pk).order_by("pk").values_list("pk", "name"))
    with _outside_lock:
        _outside_stored[context.job.pk] = (OutsideTally(), 0)
    # Forgotten with the shard's context, once it has ended.
    weakref.finalize(context, _forget_stored, context.job.pk)
    network = shard_network(context, int(plan["seed"]))
    return writers(context, names, int(plan["seed"]), network)


def _forget_stored(job_id: int) -> None:
    with _outside_lock:
        _outside_stored.pop(job_id, None)


def _stored_outside(job_id: int) -> OutsideTally | None:
    """In a shard's process: the outside events stored so far, counted from where the last look left off.

    Called in the transaction storing a batch, which holds the job row's lock: no other batch lands meanwhile.
    """
    with _outside_lock:
        found = _outside_stored.get(job_id)
    if found is None:
        return None
    tally, after = found
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(max(seq_to), 0) FROM jobs_eventbatch WHERE job_id = %s", [job_id])
        upto = int(cursor.fetchone()[0])
    if upto > after:
        tally_outside(job_id, after=after, into=tally)
        with _outside_lock:
            if job_id in _outside_stored:
                _outside_stored[job_id] = (tally, upto)
    return tally


def run(context: JobContext) -> dict[str, Any]:
    job, params = context.job, context.params
    names = _make_rows(job, params)
    rows = list(names)
    seed = params["seed"] if params["seed"] is not None else random.randrange(2**32)
    limit_s = float(params["seconds"] or settings.OCCVIZ_MAX_SECONDS)
    # The latency changes live: here, and in every shard (shard_network).
    network = job_network(params, seed)
    context.on_control(lambda action, actor, seconds: apply_latency_control(context, network, action, seconds))
    lanes, own_rows = iter(range(params["writers"] + 1, 2**31)), set(rows)
    with _outside_lock:
        _outside[job.pk] = OutsideTally()
    context.on_outside_write(
        lambda payload: record_outside_write(context, own_rows, payload), next_actor=lanes.__next__
    )
    try:
        context.run_actors(writers(context, names, seed, network), time_limit_s=limit_s, plan={"seed": seed})
    finally:
        network.close()
    # The rows locked while they are read: every outside write that landed before is
    # then recorded, and none lands after, so the rows and the events tell one story.
    with context.settling(lambda: list(Counter.objects.filter(pk__in=rows).select_for_update().values_list("pk"))):
        tally = tally_rows(job.pk, params["initial_value"])
        context.settle_outside_writes()
    try:
        figures = context.final_figures()
    finally:
        with _outside_lock:
            _outside.pop(job.pk, None)
    summary = summarize(params, figures, rows, context.elapsed_s, seed, tally, tally_outside(job.pk))
    return {**summary, "network": network.describe()}


def record_outside_write(context: JobContext, rows: set[int], payload: Mapping[str, Any]) -> None:
    """An admin's or API writer's write to one of the job's rows, as an event on that writer's lane.

    value_read/value_written: the value before and after; for a blind write that lowered the
    value, detail.erased is how much of the job's count it took away. detail.delta (after -
    before) is what the summary adds to the job's own increments.
    """
    if payload.get("resource") != "counters" or payload.get("object_id") not in rows:
        return
    write = outside_write(context, payload)
    before, after = write.before.get("value"), write.after.get("value", 0)
    detail = dict(write.detail, name=payload.get("name"))
    fields: dict[str, Any] = {"version_read": write.version_read, "value_read": before}
    if write.type == "MODIFIED":
        delta = int(after) - int(before or 0)
        detail["delta"] = delta
        # A student's press added one to the value it read: beyond that one, the write took away what it wrote over.
        erased = 1 - delta if write.plus_one else -delta
        if write.blind and erased > 0:
            detail["erased"] = erased
        kind = "outside_write"
        fields.update(version_written=write.version_written, value_written=after)
    elif write.type == "CONFLICT":
        kind = "outside_conflict"
        fields.update(value_written=after)
    elif write.type == "DELETED":
        kind = "outside_deleted"
        # What the row had counted leaves with it: the summary still counts it.
        detail.update(removed_versions=int(payload["resource_version"]) - 1, removed_value=before)
    else:
        return  # a new object is not one of the job's rows
    context.recorder.record(write.actor, 0, 1, kind, int(payload["object_id"]), detail=detail, **fields)
    with _outside_lock:
        running = _outside.get(context.job.pk)
        if running is not None:
            running.add(detail)


def read_state(job_id: int, params: Mapping[str, Any]) -> State:
    """The job's rows (the first MAX_ROWS_SHOWN) and the updates lost so far."""
    tally = tally_rows(job_id, int(params.get("initial_value") or 0))
    if not tally.rows:
        return State({"rows": []}, {"lost_updates": None})
    rows = [
        {"id": pk, "name": row_name, "value": value, "version": version}
        for pk, row_name, value, version in tally.rows[:MAX_ROWS_SHOWN]
    ]
    # Outside writes moved versions and values by their own amounts: not lost updates, unless erased.
    with _outside_lock:
        running = _outside.get(job_id)
        counted = None if running is None else running.delta + running.erased - running.commits
    if counted is None:
        outside = _stored_outside(job_id) or tally_outside(job_id)
        counted = outside.delta + outside.erased - outside.commits
    lost = tally.lost_updates + counted
    return State({"rows": rows}, {"lost_updates": lost})
