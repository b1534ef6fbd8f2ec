"""Retry policies: how long a writer waits before its next attempt, and when it gives up; and the retry loop.

The Kubernetes presets are client-go's (k8s.io/client-go/util/retry):

    DefaultRetry   = wait.Backoff{Steps: 5, Duration: 10ms, Factor: 1.0, Jitter: 0.1}
    DefaultBackoff = wait.Backoff{Steps: 4, Duration: 10ms, Factor: 5.0, Jitter: 0.1}

client-go's jitter only lengthens a wait: `d + rand * jitter * d`. Its Steps count
attempts; here `max_attempts` does, and defaults to the preset's Steps. Past the
preset's last step the wait stays at that step's length.

No wait is longer than LONGEST_WAIT_MS, whatever the base, factor and attempt: the
growth is checked against the ceiling in logarithms before it is computed, so a huge
factor or attempt number gives the ceiling, never an OverflowError.

`with_retries` is client-go's `retry.RetryOnConflict` loop for any actor with a policy:
an attempt that conflicts (or fails to serialize, deadlocks, times out on a lock) is
recorded, waited for by the policy, and tried again, until it commits or gives up.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

import psycopg

LONGEST_WAIT_MS = 60_000
"""The longest wait before a retry, and the largest base or cap a policy takes."""
LARGEST_FACTOR = 10
"""The fastest growth a policy takes (client-go's DefaultBackoff grows by 5)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    name: str
    max_attempts: int
    base_ms: float = 0.0
    factor: float = 1.0
    jitter: float = 0.0
    steps: int = 0
    """Number of growing waits in a client-go preset (0: grow until cap_ms)."""
    cap_ms: float = 0.0
    """exponential: the longest wait; the wait is drawn uniformly in [0, min(cap, base * factor^n)]."""
    full_jitter: bool = False

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {self.max_attempts}")
        for name, value, low, high in (
            ("base_ms", self.base_ms, 0.0, LONGEST_WAIT_MS),
            ("cap_ms", self.cap_ms, 0.0, LONGEST_WAIT_MS),
            ("factor", self.factor, 1.0, LARGEST_FACTOR),
            ("jitter", self.jitter, 0.0, 1.0),
        ):
            if not low <= value <= high:  # also refuses NaN
                raise ValueError(f"{name} must be from {low:g} to {high:g}, not {value!r}")

    def bounds_ms(self, retry: int) -> tuple[float, float]:
        """The shortest and longest wait before retry number `retry` (1 = the wait after the first failure)."""
        if self.base_ms == 0:
            return 0.0, 0.0
        growth = retry - 1 if self.steps == 0 else min(retry, self.steps) - 1
        nominal = self._grown(growth)
        if self.full_jitter:
            return 0.0, nominal
        return nominal, nominal * (1 + self.jitter)

    def _grown(self, growth: int) -> float:
        """base * factor^growth, at most the cap (or LONGEST_WAIT_MS), without ever computing a larger number."""
        ceiling = min(self.cap_ms, LONGEST_WAIT_MS) if self.cap_ms else LONGEST_WAIT_MS
        if self.factor > 1.0 and math.log(self.base_ms) + growth * math.log(self.factor) >= math.log(ceiling):
            return ceiling
        return min(self.base_ms * self.factor**growth, ceiling)

    def wait_ms(self, retry: int, rng: random.Random) -> float:
        low, high = self.bounds_ms(retry)
        return low + rng.random() * (high - low)


# Each preset with its default max_attempts (client-go's Steps for the Kubernetes ones).
PRESETS: dict[str, int] = {
    "immediate": 10,
    "k8s-default-retry": 5,
    "k8s-default-backoff": 4,
    "exponential": 10,
}


def make_policy(
    name: str,
    max_attempts: int | None = None,
    *,
    base_ms: float = 10.0,
    factor: float = 2.0,
    cap_ms: float = 1000.0,
) -> RetryPolicy:
    """Build a policy by preset name; `base_ms`, `factor` and `cap_ms` apply to `exponential` only."""
    if name not in PRESETS:
        raise ValueError(f"unknown retry policy {name!r}: choose one of {', '.join(PRESETS)}")
    attempts = max_attempts if max_attempts is not None else PRESETS[name]
    if name == "immediate":
        return RetryPolicy(name, attempts)
    if name == "k8s-default-retry":
        return RetryPolicy(name, attempts, base_ms=10.0, factor=1.0, jitter=0.1, steps=5)
    if name == "k8s-default-backoff":
        return RetryPolicy(name, attempts, base_ms=10.0, factor=5.0, jitter=0.1, steps=4)
    return RetryPolicy(name, attempts, base_ms=base_ms, factor=factor, cap_ms=cap_ms, full_jitter=True)


class Retrying(Protocol):
    """What `with_retries` needs of the actor it retries for (an ActorContext is one)."""

    @property
    def policy(self) -> RetryPolicy: ...

    @property
    def rng(self) -> random.Random: ...

    @property
    def record(self) -> Callable[..., None]:
        """record(op, attempt, kind, row, **fields): the actor's own events."""
        ...

    def pause(self, ms: float) -> bool:
        """Sleep `ms`; False if the actor must stop instead."""
        ...


class Retryable(Exception):
    """An attempt that failed in a way the policy retries: a conflict, a serialization failure, ..."""

    def __init__(self, kind: str, **fields: Any) -> None:
        super().__init__(kind)
        self.kind = kind
        self.fields = fields


# What an attempt returns when it failed in a way the policy retries, having recorded why.
# (Inside a transaction an attempt raises Retryable instead, so that the transaction rolls back.)
RETRY: Final = object()

# The PostgreSQL errors a retry may get past, by SQLSTATE, with the event kind each is recorded as.
_RETRYABLE_SQLSTATES = {
    "40001": "serialization_failure",
    "40P01": "deadlock",
    "55P03": "lock_timeout",
}


def with_retries(actor: Retrying, row: int, op: int, attempt_once: Callable[[int, float], bool | object]) -> bool:
    """Run `attempt_once(attempt, started)` until it commits (True), the job stops (False) or the attempts run out."""
    started = time.perf_counter()
    policy = actor.policy
    for attempt in range(1, policy.max_attempts + 1):
        try:
            outcome = attempt_once(attempt, started)
        except Retryable as failure:
            actor.record(op, attempt, failure.kind, row, **failure.fields)
            outcome = RETRY
        except psycopg.Error as error:
            kind = _RETRYABLE_SQLSTATES.get(error.sqlstate or "")
            if kind is None:
                raise
            actor.record(op, attempt, kind, row, detail={"message": str(error).strip()})
            outcome = RETRY
        if outcome is not RETRY:
            return bool(outcome)
        if attempt == policy.max_attempts:
            actor.record(op, attempt, "gave_up", row)
            return False
        wait_ms = policy.wait_ms(attempt, actor.rng)
        actor.record(op, attempt, "retry", row, duration_ms=wait_ms)
        if not actor.pause(wait_ms):
            return False
    return False
