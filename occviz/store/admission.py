"""ResourceQuota admission, as the API server's quota admission plugin does it, for every caller.

A pod's create charges its requests to a quota: read the quota, check `hard - used` for each
resource it limits, write the new `used` with compare-and-swap; on a conflict re-read and
retry, 3 times, then fail with the conflict; a pod that does not fit is denied with the API
server's message. `charge` is that loop, with the reads and writes handed in: the quota
race's admission workers write as the job does (its events are their record), the HTTP API
writes through `occviz.store.writes` (a Change per write, handed to a job that owns the quota).
`release` gives a deleted pod's charge back, as the quota controller's replenishment would.
`recount` is the quota controller's full recalculation of `used` from the pods that exist.

While a create is between its charge and its pod's write, the charge is not yet backed by a
pod, and a recalculation of `used` from the pods that exist would release it (a delete between
its pod's removal and its release, likewise, would be released twice). `in_flight` marks such
a stretch with a shared PostgreSQL advisory lock on the quota, and `recalculating` takes it
exclusively, so a recalculation in any process sees each of them either done or not begun.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from django.db import connection

from occviz.store.models import Pod, ResourceQuota, conflict_message

ADMISSION_RETRIES: Final = 3
"""The API server's quota admission retries a conflicting status write 3 times, then fails the create."""
RELEASE_ATTEMPTS: Final = 10
"""A release that keeps conflicting is left to the quota controller's next recalculation."""
# The first key of the advisory locks on quotas (the second is the quota's id): "quot".
_LOCK_CLASS: Final = 0x71756F74

Amounts = Mapping[str, int | float]


def quantity_text(value: Any) -> str:
    """An amount as a resource.Quantity string: 1 -> "1", 0.5 -> "500m"."""
    if isinstance(value, float) and not value.is_integer():
        return f"{round(value * 1000)}m"
    return str(int(value)) if isinstance(value, int | float) else str(value)


def _listed(amounts: Amounts, resources: list[str]) -> str:
    # The API server's prettyPrint: "name=quantity" pairs by name, joined by commas.
    return ",".join(f"{name}={quantity_text(amounts.get(name, 0))}" for name in resources)


def exceeded_message(pod: str, quota: str, requested: Amounts, used: Amounts, hard: Amounts) -> str:
    """The API server's 403 for a pod that `quota` has no room for, word for word (only the exceeded resources)."""
    over = exceeded(requested, used, hard) or sorted(requested)
    return (
        f'pods "{pod}" is forbidden: exceeded quota: {quota}, requested: {_listed(requested, over)}, '
        f"used: {_listed(used, over)}, limited: {_listed(hard, over)}"
    )


def exceeded(requested: Amounts, used: Amounts, hard: Amounts) -> list[str]:
    """The resources `hard` limits that `requested` on top of `used` would go over, by name."""
    return sorted(name for name in requested if name in hard and used.get(name, 0) + requested[name] > hard[name])


def limited(requested: Amounts, hard: Amounts) -> dict[str, int | float]:
    """What of `requested` a quota with `hard` charges: the resources it names."""
    return {name: amount for name, amount in requested.items() if name in hard}


@dataclass(frozen=True)
class QuotaUsage:
    """A quota as read for one admission: its name, hard and used amounts, and version."""

    name: str
    hard: Mapping[str, int | float]
    used: Mapping[str, int | float]
    version: int

    def plus(self, amounts: Amounts, sign: int = 1) -> dict[str, int | float]:
        """`used` with `amounts` added (sign 1) or taken back (sign -1, never below 0)."""
        used = dict(self.used)
        for name, amount in amounts.items():
            used[name] = max(0, used.get(name, 0) + sign * amount)
        return used


@dataclass(frozen=True)
class Admitted:
    attempt: int
    quota: QuotaUsage
    """The quota as read by the attempt that charged it."""
    used: dict[str, int | float]
    version: int


@dataclass(frozen=True)
class Denied:
    attempt: int
    quota: QuotaUsage
    message: str


@dataclass(frozen=True)
class RetriesExhausted:
    attempts: int
    message: str


Outcome = Admitted | Denied | RetriesExhausted
Read = Callable[[int], QuotaUsage]
"""read(attempt): the quota as stored now."""
Write = Callable[[int, QuotaUsage, dict[str, int | float]], int | None]
"""write(attempt, quota read, new used): compare-and-swap against quota.version; the new version, or None."""


def charge(pod: str, requested: Amounts, read: Read, write: Write, *, retries: int = ADMISSION_RETRIES) -> Outcome:
    """Admit `pod`'s `requested` amounts against one quota: charged, denied, or refused after `retries` conflicts."""
    attempts = retries + 1
    name = ""
    for attempt in range(1, attempts + 1):
        quota = read(attempt)
        name = quota.name
        charged = limited(requested, quota.hard)
        if not charged:
            return Admitted(attempt, quota, dict(quota.used), quota.version)  # nothing this quota limits
        if exceeded(charged, quota.used, quota.hard):
            return Denied(attempt, quota, exceeded_message(pod, quota.name, charged, quota.used, quota.hard))
        used = quota.plus(charged)
        version = write(attempt, quota, used)
        if version is not None:
            return Admitted(attempt, quota, used, version)
    return RetriesExhausted(attempts, conflict_message(ResourceQuota, name))


def release(requested: Amounts, read: Read, write: Write, *, attempts: int = RELEASE_ATTEMPTS) -> bool:
    """Take `requested` back off the quota's `used` with compare-and-swap, re-reading on a conflict."""
    for attempt in range(1, attempts + 1):
        quota = read(attempt)
        charged = limited(requested, quota.hard)
        if not charged:
            return True
        if write(attempt, quota, quota.plus(charged, -1)) is not None:
            return True
    return False


@contextmanager
def in_flight(quota_ids: list[int]) -> Iterator[None]:
    """Inside: a create (or delete) charged to these quotas is under way (a shared lock each; see `recalculating`)."""
    ids = sorted(set(quota_ids))  # one order for everyone's locks
    with connection.cursor() as cursor:
        for quota_id in ids:
            cursor.execute("SELECT pg_advisory_lock_shared(%s, %s)", [_LOCK_CLASS, quota_id])
        try:
            yield
        finally:
            for quota_id in reversed(ids):
                cursor.execute("SELECT pg_advisory_unlock_shared(%s, %s)", [_LOCK_CLASS, quota_id])


@contextmanager
def recalculating(quota_id: int) -> Iterator[None]:
    """Inside: no create or delete is between its pod's write and the quota's (see `in_flight`)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s, %s)", [_LOCK_CLASS, quota_id])
        try:
            yield
        finally:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [_LOCK_CLASS, quota_id])


def usage_of(quota: ResourceQuota) -> QuotaUsage:
    return QuotaUsage(quota.name, dict(quota.hard or {}), dict(quota.used or {}), quota.resource_version)


def charged_pods(namespace: str) -> dict[str, dict[str, Any]]:
    """The pods of `namespace` a quota charges, by name, with their requests.

    Every pod but a Failed one: as the API server's pod evaluator has it, a pod in a terminal
    phase holds nothing, so a recalculation gives its charge back.
    """
    pods = Pod.objects.filter(namespace=namespace).exclude(phase=Pod.Phase.FAILED)
    return {name: dict(requests or {}) for name, requests in pods.values_list("name", "requests")}


def recount(namespace: str, resources: Iterable[str]) -> dict[str, int | float]:
    """What the quota controller's full recalculation finds `used` to be: the charged pods' requests, per resource."""
    used: dict[str, int | float] = dict.fromkeys(resources, 0)
    for requests in charged_pods(namespace).values():
        for resource, amount in requests.items():
            if resource in used and isinstance(amount, int | float):
                used[resource] += amount
    return used
