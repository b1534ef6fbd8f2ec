"""The quota race's actors: the API server's quota admission workers and the quota controller.

Admission, as the API server does it for each pod, is occviz.store.admission's `charge`
(the HTTP API's pod creates run the same): read the quota, check `hard - used`, write the
new `used` with compare-and-swap; on a conflict re-read and retry, 3 times (the API
server's `checkQuotas` retries); past that the create fails with the conflict itself.
The pod is stored only after its usage was charged, so a create that fails afterwards
leaks that usage: nothing gives it back but the quota controller, which
recalculates `used` from the pods that exist every resync period and repairs it with
compare-and-swap too, retrying when an admission wrote first.

A recalculation that lands between a charge and its pod's write would release a charge
still in use, and let one pod too many in. The controller therefore counts the
creates still under way as well as the pods that exist: the `ChargeLedger` lists the
charged pods not yet stored or failed, and its snapshot waits for the charges being
written to land, so the quota's version and the ledger it reads agree. Creates and deletes
over the API in the job's namespace are waited out instead (store.admission.recalculating),
and their pods count among the pods that exist.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, connection

from occviz.concurrency.latency import Network
from occviz.jobs import shared
from occviz.jobs.recorder import EventRecorder
from occviz.store import admission
from occviz.store.admission import ADMISSION_RETRIES, QuotaUsage
from occviz.store.cas import compare_and_swap
from occviz.store.models import Pod, ResourceQuota

RESOURCE = "requests.nvidia.com/gpu"
QUOTA_NAME = "gpu-quota"
CONTROLLER = 1
"""The quota controller's actor number; the admission workers follow it."""

# The amounts as numbers, read by PostgreSQL (Django's cursor hands JSON back as text).
_READ_QUOTA = (
    "SELECT coalesce((hard ->> %s)::bigint, 0), coalesce((used ->> %s)::bigint, 0), resource_version "
    "FROM store_resourcequota WHERE id = %s"
)


def admission_workers(params: Mapping[str, Any]) -> int:
    """How many admission workers a job runs: as many as asked, but no more than there are pods.

    Pages word jobs of any parameters (compare, old rows): a missing count is one.
    """
    return min(int(params.get("workers") or 1), int(params.get("pods") or 1))


def quantity(amounts: Mapping[str, Any] | None) -> int:
    return int((amounts or {}).get(RESOURCE, 0))


def pod_name(number: int) -> str:
    return f"pod-{number}"


def exceeded_message(pod: str, request: int, used: int, hard: int) -> str:
    """The API server's 403 for a pod the job's quota has no room for (store.admission words it)."""
    return admission.exceeded_message(pod, QUOTA_NAME, {RESOURCE: request}, {RESOURCE: used}, {RESOURCE: hard})


@dataclass
class Quota:
    hard: int
    used: int
    version: int


def read_quota(quota_id: int) -> Quota:
    with connection.cursor() as cursor:
        cursor.execute(_READ_QUOTA, [RESOURCE, RESOURCE, quota_id])
        hard, used, version = cursor.fetchone()
    return Quota(int(hard), int(used), int(version))


def write_used(quota_id: int, version: int, used: int) -> int | None:
    """`used` written by compare-and-swap against `version`: the new version, or None on a conflict."""
    result = compare_and_swap(ResourceQuota, quota_id, version, {"used": {RESOURCE: used}})
    return None if result is None else int(result[0])


class ChargeLedger:
    """The charged pods whose create is still under way, and the most usage admitted pods ever held.

    In PostgreSQL (occviz.jobs.shared), so admission workers in any of the job's processes
    keep one ledger. A charge and its ledger entry are written holding the quota's shared
    advisory lock (store.admission.in_flight), each one statement, the quota's row lock held
    for the charge alone; the controller's `snapshot` takes that lock exclusively
    (store.admission.recalculating): it waits for the charges being written to land and holds
    new ones back while it reads the quota, so every charge in the version it read is either
    in the ledger, stored, or failed (leaked).
    """

    NUMBERS = ("held", "most_held", "stored_units")

    def __init__(self, job_id: int, quota_id: int, hard: int) -> None:
        self.job_id = job_id
        self.quota_id = quota_id
        self.hard = hard

    def make(self) -> None:
        """Its counts, at 0 (the job's program, before any admission)."""
        shared.make(self.job_id, dict.fromkeys(self.NUMBERS, 0))

    @contextmanager
    def charging(self) -> Iterator[None]:
        """Inside: a charge's write, and `charged` if it matched."""
        with admission.in_flight([self.quota_id]):
            yield

    @contextmanager
    def snapshot(self) -> Iterator[dict[str, int]]:
        """Inside: no charge is being written, nor an API create under way; yields the pods charged not yet stored."""
        with admission.recalculating(self.quota_id):
            yield shared.entries(self.job_id, _PENDING)

    def charged(self, pod: str, units: int) -> None:
        """Called inside `charging`, once the charge's write matched: the pod under way, the usage held."""
        shared.enter_and_add(self.job_id, _PENDING + pod, units, "held", "most_held")

    def stored(self, pod: str) -> int:
        """The pod exists now: what the pods that exist request, after it (a resync between counts it once)."""
        return int(shared.move(self.job_id, _PENDING + pod, "stored_units", 1) or 0)

    def failed(self, pod: str) -> None:
        shared.move(self.job_id, _PENDING + pod, "held", -1)

    @property
    def most_held(self) -> int:
        return int(shared.number(self.job_id, "most_held") or 0)

    @property
    def over_admitted(self) -> int:
        return max(0, self.most_held - self.hard)


_PENDING = "pending:"


Record = Callable[..., None]


@dataclass
class Admission:
    """What every admission worker shares: the quota, the pods to create, the ledger and the clocks.

    The pods taken and the workers still at work are counted in PostgreSQL (occviz.jobs.shared):
    the workers of a job over several processes take from one list of pods.
    """

    job_id: int
    namespace: str
    quota_id: int
    pods: int
    request: int
    think_ms: float
    failure_rate: float
    seed: int
    recorder: EventRecorder
    stop: threading.Event
    ledger: ChargeLedger
    network: Network = field(default_factory=lambda: Network("0"))
    """Each actor's connection: direct, or through its proxy a latency away (its thread's Django connection)."""

    def make(self) -> None:
        """Its counts and its ledger's, at 0 (the job's program, before any worker starts)."""
        shared.make(self.job_id, {"pods_taken": 0, "working": 0})
        self.ledger.make()

    def take(self) -> int | None:
        """The next pod to create (1..pods), or None when all have been taken."""
        if self.stop.is_set():
            return None
        return shared.add(self.job_id, "pods_taken", 1, below=self.pods)

    def done(self) -> bool:
        """Every pod has been admitted or denied (and stored or failed): no worker in any process is at work."""
        return shared.number(self.job_id, "working") == 0

    def worker(self, actor: int) -> Callable[[Callable[[], object]], None]:
        def act(ready: Callable[[], object]) -> None:
            with self.network.routed(actor):
                # Counted (and so connected) before the barrier: once the actors are released, every worker of
                # every process is, and connecting is not part of the race.
                shared.add(self.job_id, "working", 1)
                try:
                    ready()
                    while (number := self.take()) is not None:
                        self.admit(actor, number)
                finally:
                    shared.add(self.job_id, "working", -1)

        return act

    def admit(self, actor: int, number: int) -> None:
        """One pod's create: admission with its retries (store.admission.charge), then the pod's write (or failure)."""
        record = self.recorder.record
        pod = pod_name(number)
        started = time.perf_counter()

        def read(attempt: int) -> QuotaUsage:
            quota = read_quota(self.quota_id)
            record(actor, number, attempt, "read", self.quota_id, version_read=quota.version, value_read=quota.used)
            if self.think_ms:
                # The admission's evaluation between its read and its write: the window a rival writes in.
                time.sleep(self.think_ms / 1000.0)
            return QuotaUsage(QUOTA_NAME, {RESOURCE: quota.hard}, {RESOURCE: quota.used}, quota.version)

        def write(attempt: int, quota: QuotaUsage, used: dict[str, int | float]) -> int | None:
            with self.ledger.charging():
                version = write_used(self.quota_id, quota.version, int(used[RESOURCE]))
                if version is not None:
                    self.ledger.charged(pod, self.request)
            if version is None:
                record(
                    actor,
                    number,
                    attempt,
                    "conflict",
                    self.quota_id,
                    version_read=quota.version,
                    value_read=quantity(quota.used),
                )
                if attempt <= ADMISSION_RETRIES:
                    record(actor, number, attempt, "retry", detail={"retries": ADMISSION_RETRIES})
            return version

        outcome = admission.charge(pod, {RESOURCE: self.request}, read, write)
        if isinstance(outcome, admission.Denied):
            record(
                actor,
                number,
                outcome.attempt,
                "denied",
                self.quota_id,
                version_read=outcome.quota.version,
                value_read=quantity(outcome.quota.used),
                detail={"message": outcome.message, "hard": quantity(outcome.quota.hard)},
            )
        elif isinstance(outcome, admission.RetriesExhausted):
            record(actor, number, outcome.attempts, "retries_exhausted", detail={"message": outcome.message})
        else:
            record(
                actor,
                number,
                outcome.attempt,
                "admitted",
                self.quota_id,
                version_read=outcome.quota.version,
                version_written=outcome.version,
                value_read=quantity(outcome.quota.used),
                value_written=quantity(outcome.used),
                latency_ms=(time.perf_counter() - started) * 1000.0,
                detail={"hard": quantity(outcome.quota.hard)},
            )
            self.create(actor, number, outcome.attempt, pod)

    def create(self, actor: int, number: int, attempt: int, pod: str) -> None:
        """The pod's write, after its usage was charged: it may fail, and then the charge leaks."""
        # Decided per pod from the seed, so a seeded job fails the same pods whichever worker takes them.
        if random.Random(self.seed * 1_000 + number).random() < self.failure_rate:
            self.ledger.failed(pod)
            record_failure = {"units": self.request, "rate": self.failure_rate}
            self.recorder.record(
                actor, number, attempt, "create_failed", value_written=self.request, detail=record_failure
            )
            return
        try:
            Pod.objects.create(
                namespace=self.namespace,
                name=pod,
                requests={RESOURCE: self.request},
                phase=Pod.Phase.PENDING,
                job_id=self.job_id,
            )
        except IntegrityError:
            # A pod of that name was created over the API meanwhile: AlreadyExists, and the charge leaks.
            self.ledger.failed(pod)
            detail = {"units": self.request, "rate": self.failure_rate, "already_exists": True}
            self.recorder.record(actor, number, attempt, "create_failed", value_written=self.request, detail=detail)
            return
        actual = self.ledger.stored(pod)
        self.recorder.record(actor, number, attempt, "stored", value_written=actual)


@dataclass
class QuotaController:
    """kube-controller-manager's resource quota controller: a full recalculation every resync period."""

    admission: Admission
    resync_s: float
    until_repaired: bool
    """End once every pod is decided and `used` matches what exists (no fixed duration)."""
    resyncs: int = 0

    def run(self, ready: Callable[[], object]) -> None:
        with self.admission.network.routed(CONTROLLER):
            connection.ensure_connection()
            ready()
            self._run()

    def _run(self) -> None:
        started = time.perf_counter()
        stop = self.admission.stop
        next_at = self.resync_s
        while not stop.is_set():
            if self.until_repaired and self.admission.done() and self._settled():
                return
            wait_s = next_at - (time.perf_counter() - started)
            if wait_s > 0:
                # Short waits: the end of the admissions is noticed at once.
                stop.wait(min(wait_s, 0.05))
                continue
            self.resync()
            next_at += self.resync_s

    def _settled(self) -> bool:
        """`used` is what the pods that exist request (called once no admission is under way)."""
        return read_quota(self.admission.quota_id).used == sum(self._existing().values())

    def _existing(self) -> dict[str, int]:
        """The pods in the namespace the quota charges (store.admission.charged_pods) and what each requests."""
        return {name: quantity(requests) for name, requests in admission.charged_pods(self.admission.namespace).items()}

    def resync(self) -> None:
        """Recalculate `used` from the pods that exist (and those being created); repair it if it differs."""
        self.resyncs += 1
        workers = self.admission
        record = workers.recorder.record
        attempt = 0
        while not workers.stop.is_set():
            attempt += 1
            admitting = not workers.done()
            # Creates over the API are waited out, the job's own are listed (the ledger's snapshot: both).
            with workers.ledger.snapshot() as pending:
                quota = read_quota(workers.quota_id)
                existing = self._existing()
            in_flight = {pod: units for pod, units in pending.items() if pod not in existing}
            used = sum(existing.values()) + sum(in_flight.values())
            detail = {
                "pods": len(existing),
                "in_flight": len(in_flight),
                "exists": sum(existing.values()),
                "admitting": admitting,
            }
            if used == quota.used:
                record(
                    CONTROLLER,
                    self.resyncs,
                    attempt,
                    "resync_in_sync",
                    workers.quota_id,
                    version_read=quota.version,
                    value_read=quota.used,
                    value_written=used,
                    detail=detail,
                )
                return
            version = write_used(workers.quota_id, quota.version, used)
            if version is not None:
                detail["released"] = quota.used - used
                record(
                    CONTROLLER,
                    self.resyncs,
                    attempt,
                    "resync",
                    workers.quota_id,
                    version_read=quota.version,
                    version_written=version,
                    value_read=quota.used,
                    value_written=used,
                    detail=detail,
                )
                return
            record(
                CONTROLLER,
                self.resyncs,
                attempt,
                "resync_conflict",
                workers.quota_id,
                version_read=quota.version,
                value_read=quota.used,
            )
