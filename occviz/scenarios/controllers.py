"""Controllers A and B: 2..8 controllers reconcile one Deployment, each owning a different field.

Each controller, at its rate, GETs the object, thinks, sets its own field (status,
replicas, a label, an annotation...) to its next value and writes the whole object
back, as client-go's Update does. With `occ` the write is a compare-and-swap, and a
conflict means re-GET, re-apply the same change and retry (client-go's
`retry.RetryOnConflict`, DefaultRetry by default). With `none` the write is blind:
the fields of the object it read go back with it, and whatever another controller
wrote meanwhile is silently erased.

`History` follows the object version by version from the acknowledged writes alone
(every version after the first is one of them) and says, as it happens, which write
erased which: an `erased` event. A write is lost when another controller's write
changes its field before its owner writes that field again. At the end the job checks
that the replayed history is the stored object, and with `occ` that every
controller's last write is on it and none was erased.

Writes to the Deployment from outside the job (a student's `kubectl edit` or `replace`,
the admin) are followed: each is a version of the history on a lane named after its
writer, and a controller's field it changes is counted as erased from outside, apart
from what the controllers erased of one another.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django import forms
from django.db import connection, transaction

from occviz.concurrency.retry import PRESETS, make_policy
from occviz.concurrency.strategies import RETRY, Writer, connected, with_retries
from occviz.jobs.models import Job
from occviz.scenarios.base import (
    ERROR,
    DecimalNumberField,
    EventKind,
    Figure,
    Preset,
    Scenario,
    ScenarioForm,
    State,
    WholeNumberField,
    check_limit,
)
from occviz.scenarios.outside import Payload, outside_conflict_kind, outside_deleted_kind, outside_write
from occviz.store.cas import swap_for
from occviz.store.models import Deployment, conflict_message

if TYPE_CHECKING:
    from occviz.jobs.context import Actor, JobContext
    from occviz.jobs.recorder import EventRecorder

MIN_CONTROLLERS = 2
MAX_CONTROLLERS = 8
MAX_RATE_PER_S = 200
MAX_THINK_MS = 1000
OBJECT_NAME = "web"
STRATEGIES = ("occ", "none")
UNREADABLE = -1
"""An owned field's value when it is missing or not a number: an outside write put it so (no reconcile number is)."""


@dataclass(frozen=True)
class OwnedField:
    """The one field of the Deployment a controller reconciles: a column, or a key in a JSON column."""

    path: str
    """As `kubectl get -o yaml` shows where it lives: `status.observedGeneration`, `metadata.labels[...]`."""
    column: str
    key: str = ""

    def get(self, content: Mapping[str, Any]) -> int:
        # Labels and annotations are strings in Kubernetes; the value is the controller's reconcile number.
        try:
            return int(content[self.column][self.key] if self.key else content[self.column])
        except (KeyError, TypeError, ValueError):
            return UNREADABLE

    def put(self, content: dict[str, Any], value: int) -> None:
        if not self.key:
            content[self.column] = value
        elif self.column in ("labels", "annotations"):
            content[self.column] = {**content[self.column], self.key: str(value)}
        else:
            content[self.column] = {**content[self.column], self.key: value}


# Controller A owns the first, B the second, ...
FIELDS = (
    OwnedField("status.observedGeneration", "status", "observedGeneration"),
    OwnedField("spec.replicas", "replicas"),
    OwnedField("metadata.labels[occviz.dev/revision]", "labels", "occviz.dev/revision"),
    OwnedField("metadata.annotations[occviz.dev/last-sync]", "annotations", "occviz.dev/last-sync"),
    OwnedField("status.availableReplicas", "status", "availableReplicas"),
    OwnedField("metadata.labels[occviz.dev/tier-generation]", "labels", "occviz.dev/tier-generation"),
    OwnedField("metadata.annotations[occviz.dev/audit]", "annotations", "occviz.dev/audit"),
    OwnedField("status.updatedReplicas", "status", "updatedReplicas"),
)
COLUMNS = ("replicas", "labels", "annotations", "status")

# The whole object goes back with every write, as client-go's Update sends it: checked or blind.
_CHECKED = swap_for(Deployment, tuple((column, False) for column in COLUMNS), True)
_BLIND = swap_for(Deployment, tuple((column, False) for column in COLUMNS), False)
_GET = f"SELECT resource_version, {', '.join(COLUMNS)} FROM store_deployment WHERE id = %s"


def controller_name(number: int) -> str:
    return f"controller {chr(ord('A') + number - 1)}"


class ControllersForm(ScenarioForm):
    strategy = forms.ChoiceField(
        choices=[(s, s) for s in STRATEGIES],
        initial="occ",
        help_text="occ: compare-and-swap, re-GET and retry on conflict; none: blind whole-object writes.",
    )
    controllers = WholeNumberField(
        min_value=MIN_CONTROLLERS, max_value=MAX_CONTROLLERS, initial=2, help_text="2 to 8, each owning a field."
    )
    seconds = DecimalNumberField(min_value=0.5, initial=10.0, help_text="How long the controllers run.")
    rate_per_s = DecimalNumberField(
        min_value=0.1,
        max_value=MAX_RATE_PER_S,
        initial=20.0,
        label="Rate (/s)",
        help_text="Reconciles per second, each.",
    )
    think_ms = DecimalNumberField(
        min_value=0,
        max_value=MAX_THINK_MS,
        required=False,
        initial=5.0,
        label="Think time (ms)",
        help_text="Between the GET and the write: the window another controller's write lands in.",
    )
    retry = forms.ChoiceField(
        choices=[(p, p) for p in PRESETS],
        required=False,
        initial="k8s-default-retry",
        help_text="occ only: client-go's RetryOnConflict uses DefaultRetry (5 steps of 10 ms, jitter 0.1).",
    )
    max_attempts = WholeNumberField(min_value=1, required=False, help_text="Default: the retry policy's steps.")
    seed = WholeNumberField(required=False, min_value=0, max_value=2**32 - 1, help_text="Seed for the jitter.")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        check_limit(self, "controllers", data.get("controllers"), "OCCVIZ_MAX_WRITERS", "controllers")
        check_limit(self, "seconds", data.get("seconds"), "OCCVIZ_MAX_SECONDS", "seconds")
        check_limit(self, "think_ms", data.get("think_ms"), "OCCVIZ_MAX_THINK_MS", "ms of think time")
        check_limit(self, "max_attempts", data.get("max_attempts"), "OCCVIZ_MAX_ATTEMPTS", "attempts")
        return data


@dataclass(frozen=True)
class Erasure:
    """A write that changed another controller's field before its owner wrote it again."""

    eraser: int
    op: int
    version_read: int
    version: int
    victim: int
    erased_value: int
    set_at: int
    restored_value: int


@dataclass
class _Write:
    actor: int
    op: int
    version_read: int
    version: int
    values: tuple[int, ...]


@dataclass
class History:
    """The object version by version, from its acknowledged writes, and the writes erased on the way.

    Writers hand over each acknowledged write (`acknowledge`) in whatever order their
    threads get here; the writes are applied in version order. `on_erased` is told of
    each lost write once, as it is erased.
    """

    version: int
    values: list[int]
    on_erased: Callable[[Erasure], None] = lambda erasure: None
    set_at: list[int] = field(init=False)
    """For each field, the version whose write set its current value."""
    own_latest: list[int] = field(init=False)
    """For each field, the version of its owner's latest applied write (the initial version before any)."""
    acknowledged: list[dict[int, int]] = field(init=False)
    """For each controller, the version of each value it wrote."""
    lost: list[Erasure] = field(init=False, default_factory=list)
    start: int = field(init=False)
    _lost_writes: set[tuple[int, int]] = field(init=False, default_factory=set)
    _pending: dict[int, _Write] = field(init=False, default_factory=dict)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.start = self.version
        self.set_at = [self.version] * len(self.values)
        self.own_latest = [self.version] * len(self.values)
        self.acknowledged = [{} for _ in self.values]

    def acknowledge(self, actor: int, op: int, version_read: int, version: int, values: tuple[int, ...]) -> None:
        """A write at `version` that left the fields at `values`: a controller's (actor 1..n) or an outside lane's."""
        with self._lock:
            self._pending[version] = _Write(actor, op, version_read, version, values)
            while self.version + 1 in self._pending:
                self._apply(self._pending.pop(self.version + 1))

    @property
    def waiting(self) -> int:
        """Acknowledged writes not applied yet: a version before them was never handed over."""
        return len(self._pending)

    def last_writes(self) -> list[tuple[int | None, int | None, int]]:
        """Per controller: (value, version) of its latest applied write (None before any), and its writes lost."""
        with self._lock:
            rows = []
            for index, written in enumerate(self.acknowledged):
                version = self.own_latest[index]
                value = next((value for value, at in written.items() if at == version), None)
                rows.append((value, version if value is not None else None, self.lost_of(index + 1)))
            return rows

    def lost_of(self, actor: int) -> int:
        return sum(1 for erasure in self.lost if erasure.victim == actor)

    def by_outside_lane(self, actor: int) -> bool:
        """A write from outside the job: its lane follows the controllers'."""
        return actor > len(self.values)

    def _apply(self, write: _Write) -> None:
        if not self.by_outside_lane(write.actor):
            self.acknowledged[write.actor - 1][write.values[write.actor - 1]] = write.version
        for index, value in enumerate(write.values):
            owner = index + 1
            if owner == write.actor:
                self.set_at[index] = self.own_latest[index] = write.version
            elif value != self.values[index]:
                # Erased only if the owner had not written the field again since (a value it had
                # replaced itself, put back by an earlier blind write, is no loss of its own) and
                # not counted already (a lost value put back by a blind write, then erased again).
                set_at = self.set_at[index]
                if set_at == self.own_latest[index] != self.start and (owner, set_at) not in self._lost_writes:
                    self._lost_writes.add((owner, set_at))
                    erasure = Erasure(
                        eraser=write.actor,
                        op=write.op,
                        version_read=write.version_read,
                        version=write.version,
                        victim=owner,
                        erased_value=self.values[index],
                        set_at=self.set_at[index],
                        restored_value=value,
                    )
                    self.lost.append(erasure)
                    self.on_erased(erasure)
                self.set_at[index] = self.acknowledged[index].get(value, self.start)
            self.values[index] = value
        self.version = write.version


def initial_content(controllers: int) -> dict[str, Any]:
    content: dict[str, Any] = {
        "replicas": 0,
        "labels": {"app": OBJECT_NAME},
        "annotations": {},
        "status": {},
    }
    for owned in FIELDS[:controllers]:
        owned.put(content, 0)
    return content


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


@dataclass
class Controller:
    """One controller: its writer (session, policy, clocks), its field, and the history it reports to."""

    writer: Writer
    owned: OwnedField
    row: int
    controllers: int
    history: History
    blind: bool

    def get(self, op: int, attempt: int) -> tuple[int, dict[str, Any]]:
        started = time.perf_counter()
        found = self.writer.cursor.one(_GET, [self.row])
        if found is None:
            raise Deployment.DoesNotExist(f"deployment {self.row} was deleted while the job ran")
        version, *columns = found
        content = dict(zip(COLUMNS, columns, strict=True))
        self.writer.record(
            op,
            attempt,
            "read",
            self.row,
            version_read=version,
            value_read=self.owned.get(content),
            duration_ms=(time.perf_counter() - started) * 1000.0,
        )
        return version, content

    def reconcile(self, op: int) -> bool:
        """Set this controller's field to `op` (its reconcile number); True once a write with it was acknowledged."""
        if self.blind:
            return self._attempt(op, 1, time.perf_counter()) is True
        return with_retries(self.writer, self.row, op, lambda attempt, started: self._attempt(op, attempt, started))

    def _attempt(self, op: int, attempt: int, started: float) -> bool | object:
        version, content = self.get(op, attempt)
        if not self.writer.pause(self.writer.think_ms):
            return False
        self.owned.put(content, op)  # re-applied to what was just read: the change, not the old object
        swap = _BLIND if self.blind else _CHECKED
        t = time.perf_counter()
        result = swap.run(self.row, version, [content[column] for column in COLUMNS], cursor=self.writer.cursor)
        took_ms = (time.perf_counter() - t) * 1000.0
        if result is None:
            self.writer.record(op, attempt, "conflict", self.row, version_read=version, duration_ms=took_ms)
            return RETRY
        written = int(result[0])
        overwrote = written - version - 1  # versions that landed between the GET and this blind write
        self.writer.record(
            op,
            attempt,
            "committed",
            self.row,
            version_read=version,
            version_written=written,
            value_written=op,
            duration_ms=took_ms,
            latency_ms=(time.perf_counter() - started) * 1000.0,
            detail={"field": self.owned.path, **({"overwrote": overwrote} if overwrote else {})},
        )
        values = tuple(owned.get(content) for owned in FIELDS[: self.controllers])
        self.history.acknowledge(self.writer.number, op, version, written, values)
        return True

    def run(self, seconds: float, interval_s: float, stop: threading.Event) -> None:
        """Reconcile every `interval_s` until the job stops; a late reconcile does not make the next one sooner."""
        writer = self.writer
        writer.deadline = time.perf_counter() + seconds
        next_at = time.perf_counter()
        op = 0
        while not stop.is_set() and writer.ms_left() > 0:
            wait_ms = (next_at - time.perf_counter()) * 1000.0
            if wait_ms > 0 and not writer.pause(wait_ms):
                break
            op += 1
            self.reconcile(op)
            next_at = max(next_at + interval_s, time.perf_counter())


# The controllers' histories while their jobs run in this process: the live state's last writes.
_running: dict[int, History] = {}
_running_lock = threading.Lock()


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
    policy = make_policy(params["retry"], params.get("max_attempts"))
    seed = params["seed"] if params.get("seed") is not None else random.randrange(2**32)
    seconds = float(params["seconds"])
    interval_s = 1.0 / float(params["rate_per_s"])

    def controller_actor(number: int) -> Actor:
        def act(ready: Callable[[], object]) -> None:
            writer = Writer(
                number=number,
                recorder=context.recorder,
                policy=policy,
                think_ms=float(params["think_ms"] or 0),
                stop=context.stop,
                rng=random.Random(seed * 1_000 + number),
            )
            with connected(writer):
                ready()
                controller = Controller(
                    writer, FIELDS[number - 1], deployment.pk, count, history, blind=params["strategy"] == "none"
                )
                controller.run(seconds, interval_s, context.stop)

        return act

    with _running_lock:
        _running[job.pk] = history
    try:
        context.run_actors([controller_actor(n) for n in range(1, count + 1)], time_limit_s=seconds)
        with transaction.atomic():
            # The object locked while the last outside writes are handed over: the history then ends where it does.
            list(Deployment.objects.filter(pk=deployment.pk).select_for_update().values_list("pk"))
            context.settle_outside_writes()
        context.recorder.flush()
    finally:
        with _running_lock:
            _running.pop(job.pk, None)
    return summarize(job, params, deployment.pk, history, context.elapsed_s, seed)


def _stored(row: int) -> tuple[int, dict[str, Any]]:
    stored = Deployment.objects.get(pk=row)
    return stored.resource_version, {column: getattr(stored, column) for column in COLUMNS}


def summarize(
    job: Job, params: Mapping[str, Any], row: int, history: History, elapsed_s: float, seed: int
) -> dict[str, Any]:
    """The job's figures from its stored events, checked against the stored object and the replayed history."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT kind, count(*) FROM jobs_event WHERE job_id = %s GROUP BY kind", [job.pk])
        by_kind = dict(cursor.fetchall())
        cursor.execute(
            "SELECT DISTINCT ON (actor) actor, value_written, version_written FROM jobs_event "
            "WHERE job_id = %s AND kind = 'committed' ORDER BY actor, version_written DESC",
            [job.pk],
        )
        last = {actor: (value, version) for actor, value, version in cursor.fetchall()}
        cursor.execute(
            "SELECT actor, count(*) FROM jobs_event WHERE job_id = %s AND kind = 'committed' GROUP BY actor", [job.pk]
        )
        writes_by = dict(cursor.fetchall())
        cursor.execute(
            "SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY latency_ms) "
            "FROM jobs_event WHERE job_id = %s AND kind = 'committed'",
            [job.pk],
        )
        latency = cursor.fetchone()[0] or [None, None, None]
    count = int(params["controllers"])
    writes = int(by_kind.get("committed", 0))
    outside_writes = int(by_kind.get("outside_write", 0))
    erased = int(by_kind.get("erased", 0)) + int(by_kind.get("outside_erased", 0))
    from_outside = [erasure for erasure in history.lost if history.by_outside_lane(erasure.eraser)]
    final_version, content = _stored(row)
    on_object = [owned.get(content) for owned in FIELDS[:count]]

    per_controller = []
    missing = []
    for number in range(1, count + 1):
        value, version = last.get(number, (None, None))
        present = value is None or on_object[number - 1] == value
        # A last write that an outside writer changed afterwards is gone by their hand, not the controllers'.
        taken = any(e.victim == number and e.set_at == version for e in from_outside)
        if not present and not taken:
            missing.append(controller_name(number))
        per_controller.append(
            {
                "controller": controller_name(number),
                "field": FIELDS[number - 1].path,
                "writes": int(writes_by.get(number, 0)),
                "last_value": value,
                "last_version": version,
                "on_object": on_object[number - 1],
                "last_write_present": present,
                "lost": history.lost_of(number),
                "erased_from_outside": sum(1 for erasure in from_outside if erasure.victim == number),
            }
        )

    # Every version after the first is one acknowledged write, and replaying them gives the stored object.
    problems = []
    followed = writes + outside_writes
    if final_version - 1 != followed:
        # Written after the job stopped following outside writes (or by a writer the store does not log).
        problems.append(
            f"the object is at v{final_version} but the job followed {followed} writes: "
            f"{final_version - 1 - followed} writes it did not see"
        )
    if history.waiting or history.version != final_version or history.values != on_object:
        problems.append(f"replaying the {followed} followed writes does not give the stored object v{final_version}")
    if erased != len(history.lost):
        problems.append(f"{erased} erased events stored for {len(history.lost)} lost writes")
    strategy = params["strategy"]
    lost = len(history.lost) - len(from_outside)
    outside = ""
    if outside_writes:
        by_lane = "" if not from_outside else f", erasing {len(from_outside)} controller write(s)"
        outside = f"; {outside_writes} write(s) from outside followed{by_lane}"
    if problems:
        ok, verdict = False, "; ".join(problems)
    elif strategy == "occ":
        ok = lost == 0 and not missing
        verdict = (
            f"every controller's last write is on the object (v{final_version}) unless erased from outside, and none "
            f"of the {writes} acknowledged writes was erased by another controller; "
            f"{int(by_kind.get('conflict', 0))} conflicts were re-read and re-applied{outside}"
            if ok
            else f"{lost} acknowledged writes erased; last write missing for {', '.join(missing) or 'none'}{outside}"
        )
    else:
        ok = True
        verdict = (
            f"{writes} blind writes, {lost} acknowledged fields erased, counted exactly (replaying the writes gives "
            f"the stored object v{final_version}); last write missing at the end for {', '.join(missing) or 'none'}"
            f"{outside}"
        )
    return {
        "strategy": strategy,
        "retry": params["retry"] if strategy == "occ" else None,
        "controllers": count,
        "seconds": params["seconds"],
        "rate_per_s": params["rate_per_s"],
        "think_ms": params["think_ms"],
        "seed": seed,
        "writes": writes,
        "conflicts": int(by_kind.get("conflict", 0)),
        "retries": int(by_kind.get("retry", 0)),
        "gave_up": int(by_kind.get("gave_up", 0)),
        "errors": int(by_kind.get("error", 0)),
        "lost_fields": lost,
        "outside_writes": outside_writes,
        "outside_conflicts": int(by_kind.get("outside_conflict", 0)),
        "erased_from_outside": len(from_outside),
        "per_controller": per_controller,
        "object_version": final_version,
        "object": content,
        "invariant_ok": ok,
        "invariant": verdict,
        "duration_s": round(elapsed_s, 4),
        "writes_per_s": round(writes / elapsed_s, 1) if elapsed_s > 0 else 0.0,
        "latency_ms": {
            name: None if value is None else round(value, 3)
            for name, value in zip(("p50", "p95", "p99"), latency, strict=True)
        },
    }


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
    ended: dict[str, dict[str, Any]] = {}
    if history is None:
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


_CONFLICT_409 = f"409 Conflict: {conflict_message(Deployment, OBJECT_NAME)}"


class Controllers(Scenario):
    name = "controllers"
    title = "Controller race"
    description = (
        "Controllers A and B (up to H) reconcile the same Deployment, each owning a field: with occ a conflict "
        "is re-read and re-applied, with blind writes one controller silently erases another's work."
    )
    form_class = ControllersForm
    sections = {
        "Controllers": ("strategy", "controllers", "seconds", "rate_per_s", "think_ms"),
        "Retry on conflict": ("retry", "max_attempts"),
        "Starting point": ("seed",),
    }
    actor_label = "controller {n}"
    actors_param = "controllers"
    state_keys = ("deployment", "controllers")
    state_template = "scenarios/controllers.html"
    state_title = "The Deployment"
    script = "occviz/scenarios/controllers.js"
    kinds = (
        EventKind("read", "GET", ("{who} GET v{version_read}",), "#8a94a6", "tick"),
        EventKind(
            "committed",
            "write",
            (
                "{who} set {detail.field} = {value_written} with a blind write v{version_read} → v{version_written}, "
                "over {detail.overwrote} newer version(s)",
                "{who} set {detail.field} = {value_written}: v{version_read} → v{version_written}",
            ),
            "#1a9e4b",
            "dot",
            ring_when="overwrote",
            ring_label="blind write over newer versions",
            writes=True,
        ),
        EventKind(
            "conflict",
            "conflict",
            ("{who}'s update conflicted: it had read v{version_read}",),
            "#d62828",
            "cross",
            explain=_CONFLICT_409,
            refused=True,
        ),
        EventKind(
            "retry",
            "retry wait",
            ("{who} waits {duration_ms:ms}, then GETs again and re-applies (attempt {next_attempt})",),
            "#f08c00",
            "bar-after",
            folds_into="conflict",
            fold=", re-GET and re-apply in {duration_ms:ms}",
        ),
        EventKind("gave_up", "gave up", ("{who} gave up after {attempt} attempts",), "#111111", "square"),
        EventKind(
            "erased",
            "erased",
            (
                "{who}'s write v{version_written} erased {detail.victim}'s {detail.field} = {value_read} "
                "(set at v{detail.set_at}): back to {value_written}",
            ),
            "#b5179e",
            "star",
        ),
        EventKind(
            "outside_write",
            "outside write",
            (
                "{detail.writer} via {detail.via_words}: {detail.blind} write v{version_written}, "
                "changing {detail.changed}",
                "{detail.writer} via {detail.via_words}: wrote v{version_read} → v{version_written}, "
                "changing {detail.changed}",
            ),
            "#0f766e",
            "dot",
            ring_when="blind",
            ring_label="blind write (no resourceVersion)",
        ),
        EventKind(
            "outside_erased",
            "erased from outside",
            (
                "{who}'s write v{version_written} erased {detail.victim}'s {detail.field} = {value_read} "
                "(set at v{detail.set_at}): now {value_written}",
            ),
            "#7c3aed",
            "star",
        ),
        outside_conflict_kind(_CONFLICT_409),
        outside_deleted_kind("the Deployment"),
        ERROR,
    )
    figures = (
        Figure("writes", "writes", count=("committed",)),
        Figure("conflicts", "conflicts", count=("conflict",)),
        Figure("retries", "retries", count=("retry",)),
        Figure("gave_up", "gave up", count=("gave_up",)),
        Figure("lost_fields", "fields erased", count=("erased",), alarm=True),
        Figure("outside_writes", "outside writes", count=("outside_write",)),
        Figure("erased_from_outside", "erased from outside", count=("outside_erased",)),
        Figure("errors", "errors", count=("error",), shown=False),
        Figure("writes_per_s", "writes/s", per_second=("committed",)),
        Figure("latency_ms", "latency p50 / p95 / p99 (ms)", percentiles=("committed",)),
    )
    rates = ("committed", "conflict", "erased")
    compared = (
        ("strategy", "strategy"),
        ("controllers", "controllers"),
        ("rate_per_s", "rate (/s each)"),
        ("think_ms", "think time (ms)"),
        ("writes", "writes"),
        ("conflicts", "conflicts"),
        ("retries", "retries"),
        ("gave_up", "gave up"),
        ("lost_fields", "fields erased"),
        ("writes_per_s", "writes per second"),
        ("latency_ms.p50", "latency p50 (ms)"),
        ("latency_ms.p99", "latency p99 (ms)"),
        ("duration_s", "duration (s)"),
    )
    presets = (
        Preset(
            "two-occ",
            "Two controllers, occ",
            "A and B conflict, re-GET and re-apply their change: neither field is lost.",
            {"strategy": "occ", "controllers": 2, "rate_per_s": 50, "think_ms": 5, "seconds": 10},
        ),
        Preset(
            "two-none",
            "Two controllers, none (lost fields)",
            "A and B write back the whole object they read: each silently erases the other's field.",
            {"strategy": "none", "controllers": 2, "rate_per_s": 50, "think_ms": 5, "seconds": 10},
        ),
        Preset(
            "eight-occ",
            "Eight controllers",
            "Eight controllers on one object: conflicts and retries climb, still nothing lost.",
            {"strategy": "occ", "controllers": 8, "rate_per_s": 20, "think_ms": 5, "seconds": 15},
        ),
    )

    def run(self, context: JobContext) -> dict[str, Any]:
        return run(context)

    def read_state(self, job_id: int, params: Mapping[str, Any]) -> State:
        return read_state(job_id, params)

    def actor_name(self, number: int) -> str:
        return controller_name(number)

    def setup(self, params: Mapping[str, Any]) -> str:
        line = (
            f"{params.get('strategy')}, {params.get('controllers')} controllers at {params.get('rate_per_s'):g}/s "
            f"for {params.get('seconds'):g} s"
        )
        if params.get("think_ms"):
            line += f", think {params['think_ms']:g} ms"
        if params.get("strategy") == "occ":
            line += f", retry {params.get('retry')}"
        return line


scenario = Controllers()
