"""The counter race's summary: its final figures (its last snapshot's, as every page shows them), checked against
its rows.

Protected strategies must show final = initial + committed; `none` must have counted its
lost updates exactly: every committed blind write moved the version once, so versions
written minus value gained is the number of updates erased.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import connection

from occviz.scenarios.counter.actors import PROTECTED

if TYPE_CHECKING:
    from occviz.jobs.figures import Totals

FAILED_ATTEMPTS = ("conflict", "serialization_failure", "deadlock", "lock_timeout")
"""The attempts that did not commit: with the commits, every attempt a writer made."""


@dataclass(frozen=True)
class RowTally:
    """The job's counter rows as stored now, and what their versions and values say."""

    rows: list[tuple[int, str, int, int]]  # (id, name, value, resource_version)
    versions_written: int  # every committed write, blind or not, moved its row's version by exactly one
    value_gained: int

    @property
    def lost_updates(self) -> int:
        """Writes that landed but whose increment did not survive: erased by a blind write."""
        return self.versions_written - self.value_gained


def tally_rows(job_id: int, initial_value: int) -> RowTally:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, name, value, resource_version FROM store_counter WHERE job_id = %s ORDER BY id", [job_id]
        )
        rows = cursor.fetchall()
    return RowTally(
        rows=rows,
        versions_written=sum(version - 1 for _, _, _, version in rows),
        value_gained=sum(value - initial_value for _, _, value, _ in rows),
    )


@dataclass
class OutsideTally:
    """What the outside writers' events (the admin's, the API's) did to the job's rows."""

    commits: int = 0
    delta: int = 0
    """The sum of their writes' after - before: what the rows gained (or lost) by them."""
    erased: int = 0
    """What blind writes took away from the count: the job's increments they wrote over."""
    erased_by: dict[str, int] = field(default_factory=dict)
    removed_versions: int = 0
    removed_value: int = 0
    """Versions written to, and value of, rows deleted from outside (counted as if still there)."""
    removed_rows: int = 0

    def add(self, detail: Mapping[str, Any]) -> None:
        """Count one outside event, by its detail."""
        if "delta" in detail:
            self.commits += 1
            self.delta += int(detail["delta"])
        if detail.get("erased"):
            self.erased += int(detail["erased"])
            self.erased_by[detail["lane"]] = self.erased_by.get(detail["lane"], 0) + int(detail["erased"])
        if "removed_versions" in detail:
            self.removed_rows += 1
            self.removed_versions += int(detail["removed_versions"])
            self.removed_value += int(detail["removed_value"] or 0)


def tally_outside(job_id: int, *, after: int = 0, into: OutsideTally | None = None) -> OutsideTally:
    """Sum the outside events' details (only outside events carry a lane): a few rows, however long the job.

    `after`, `into`: count only the batches after event `after`, on to the tally `into`.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT e.d FROM jobs_eventbatch AS b CROSS JOIN LATERAL jsonb_each(b.detail) AS e(k, d) "
            "WHERE b.job_id = %s AND b.seq_to > %s AND e.d ? 'lane' ORDER BY b.seq_from, e.k::int",
            [job_id, after],
        )
        details = [json.loads(d) if isinstance(d, str) else d for (d,) in cursor.fetchall()]
    tally = OutsideTally() if into is None else into
    for detail in details:
        tally.add(detail)
    return tally


@dataclass(frozen=True)
class Reckoning:
    """The rows against the events: what the job's own commits should have added, and what they did.

    Outside writes count too: the rows should hold the job's own increments plus what the
    outside writers' writes added (after - before), so an API increment is no lost update;
    a blind outside write that lowered the value erased that much of the job's count.
    """

    committed: int
    initial_value: int
    gained: int
    """What the rows gained, rows deleted from outside counted as they were."""
    job_versions: int
    """The versions the job's own writes moved (every committed write moved one, blind or not)."""
    outside: OutsideTally

    @classmethod
    def of(cls, committed: int, rows: int, initial_value: int, tally: RowTally, outside: OutsideTally) -> Reckoning:
        return cls(
            committed=committed,
            initial_value=initial_value * rows,
            gained=tally.value_gained + outside.removed_value - initial_value * outside.removed_rows,
            job_versions=tally.versions_written + outside.removed_versions - outside.commits,
            outside=outside,
        )

    @property
    def final_value(self) -> int:
        return self.initial_value + self.gained

    @property
    def lost(self) -> int:
        """The job's commits whose increment is not on the rows."""
        return self.committed - (self.gained - self.outside.delta)

    def verdict(self, protected: bool) -> tuple[bool, str]:
        """Protected strategies: nothing lost. `none`: the updates lost, counted exactly (the versions agree)."""
        outside, committed, lost = self.outside, self.committed, self.lost
        from_outside = (
            f" + {outside.delta} from {outside.commits} outside write{'s' * (outside.commits != 1)}"
            if outside.commits
            else ""
        )
        sum_of = f"initial {self.initial_value} + {committed} committed{from_outside}"
        if protected:
            ok = lost == 0 and self.job_versions == committed
            verdict = (
                f"final {self.final_value} = {sum_of}: no update lost"
                if ok
                else f"final {self.final_value} != {sum_of}: {lost} updates lost"
            )
        else:
            ok = self.job_versions == committed
            verdict = (
                f"{committed} blind writes committed, the value rose by {self.gained - outside.delta}{from_outside}: "
                f"{lost} updates lost, counted exactly (the rows' versions confirm {self.job_versions} writes)"
                if ok
                else f"the job counted {committed} writes but the rows' versions show {self.job_versions}"
            )
        if outside.erased:
            by = ", ".join(f"{n} by {lane}" for lane, n in outside.erased_by.items())
            verdict += f"; {outside.erased} increments erased by blind outside writes ({by}): lost updates"
        return ok, verdict


# The figures the summary reports as the job's final snapshot has them.
FIGURES = (
    "attempts",
    "committed",
    "conflicts",
    "retries",
    "gave_up",
    "serialization_failures",
    "deadlocks",
    "lock_timeouts",
    "lock_waits",
    "lock_wait_ms",
    "errors",
)


def summarize(
    params: Mapping[str, Any],
    figures: Totals,
    rows: list[int],
    elapsed_s: float,
    seed: int,
    tally: RowTally,
    outside: OutsideTally,
) -> dict[str, Any]:
    """The job's final figures checked against its rows (as `tally` read them): it adds only the invariant."""
    committed = int(figures.get("committed") or 0)
    reckoning = Reckoning.of(committed, len(rows), params["initial_value"], tally, outside)
    strategy = params["strategy"]
    ok, verdict = reckoning.verdict(strategy in PROTECTED)
    return {
        "strategy": strategy,
        "retry": params["retry"] if strategy in {"occ", "pessimistic", "serializable"} else None,
        "max_attempts": params["max_attempts"],
        "writers": params["writers"],
        "rows": len(rows),
        "increments": params["increments"],
        "seconds": params["seconds"],
        "think_ms": params["think_ms"],
        "seed": seed,
        **{key: figures.get(key, 0) for key in FIGURES},
        "initial_value": reckoning.initial_value,
        "final_value": reckoning.final_value,
        "lost_updates": reckoning.lost + outside.erased,
        "outside_writes": outside.commits,
        "outside_delta": outside.delta,
        "outside_conflicts": figures.get("outside_conflicts", 0),
        "lost_to_outside_blind_writes": outside.erased,
        "invariant_ok": ok,
        "invariant": verdict,
        "duration_s": round(elapsed_s, 4),
        "commits_per_s": figures.get("commits_per_s", 0.0),
        "latency_ms": figures.get("latency_ms") or {"p50": None, "p95": None, "p99": None},
    }
