"""The quota race's summary: its figures from the stored events and objects, and the invariant's verdict.

The job checks that the pods admitted never held more than `hard` at once, and that,
once no admission was under way, a resync left `used` equal to what the pods that exist
request. `used` itself may go higher: it is charged before each pod is created, so a
create that fails leaks its charge until a resync repairs it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db import connection

from occviz.scenarios.quota.actors import QUOTA_NAME, RESOURCE, ChargeLedger, admission_workers, quantity
from occviz.store import admission
from occviz.store.models import ResourceQuota

_OUTSIDE_WRITES = ("outside_charge", "outside_release", "outside_write")


def _counts(job_id: int) -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT kind, count(*) FROM jobs_event WHERE job_id = %s GROUP BY kind", [job_id])
        return {kind: int(count) for kind, count in cursor.fetchall()}


@dataclass(frozen=True)
class Resyncs:
    """The quota controller's recalculations that ended (repaired, or found nothing to repair), in order."""

    done: list[dict[str, Any]]

    @classmethod
    def of(cls, job_id: int) -> Resyncs:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT kind, value_read, value_written, detail FROM jobs_event "
                "WHERE job_id = %s AND kind IN ('resync', 'resync_in_sync') ORDER BY seq",
                [job_id],
            )
            return cls(
                [
                    {"kind": kind, "used_before": before, "used_after": after, **_detail(detail)}
                    for kind, before, after, detail in cursor.fetchall()
                ]
            )

    @property
    def repairs(self) -> list[dict[str, Any]]:
        return [resync for resync in self.done if resync["kind"] == "resync" and resync.get("released", 0) > 0]

    @property
    def quiet(self) -> list[dict[str, Any]]:
        """Those with nothing under way: the one check of `used` against what exists that must hold exactly."""
        return [resync for resync in self.done if not resync["admitting"] and not resync["in_flight"]]

    @property
    def quiet_wrong(self) -> list[dict[str, Any]]:
        return [resync for resync in self.quiet if resync["used_after"] != resync["exists"]]

    def said(self, used_final: int, actual_final: int, period_s: float) -> list[str]:
        """What the resyncs did to `used`, and the leak that stands if none came after it."""
        parts = []
        if self.quiet_wrong:
            wrong = self.quiet_wrong[0]
            parts.append(
                f"a resync with nothing in flight left used {wrong['used_after']} for {wrong['exists']} that exist"
            )
        elif self.quiet:
            parts.append(f"after the last quiet resync used {self.quiet[-1]['used_after']} = what exists")
        gap = used_final - actual_final
        if gap > 0 and not self.quiet_wrong:
            parts.append(
                f"a leak of {gap} stands (used {used_final}, pods that exist request {actual_final}): "
                f"no resync after it within the job (period {period_s:g} s)"
            )
        elif self.repairs:
            parts.append(f"the resync released {self.repairs[-1]['released']} leaked")
        return parts


def _detail(detail: Any) -> dict[str, Any]:
    # The events view gives detail back as JSON text through Django's cursor.
    return json.loads(detail) if isinstance(detail, str) else dict(detail or {})


def stored(job_id: int) -> tuple[int, int]:
    """(quota's used, what the pods it charges in its namespace request, the job's and the API's), as stored now."""
    quota = ResourceQuota.objects.filter(job_id=job_id, name=QUOTA_NAME).values_list("used", "namespace").first()
    used, namespace = quota if quota is not None else (None, f"job-{job_id}")
    # The pods the quota controller's recount charges: the same rule as its resync.
    actual = sum(quantity(requests) for requests in admission.charged_pods(namespace).values())
    return quantity(used), actual


def peak_admitted(job_id: int) -> int:
    """The most usage admitted pods held at once, the job's and the API's, in the order of the quota's versions.

    Every charge and release is a write of the quota, so its version orders them all, whenever
    the outside ones were handed to the job. A charge whose pod's create failed is left out (it
    never held anything); a resync's write is neither.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT kind, op, version_written, value_read, value_written, detail FROM jobs_event "
            "WHERE job_id = %s AND kind IN ('admitted', 'create_failed', 'outside_charge', 'outside_release')",
            [job_id],
        )
        rows = cursor.fetchall()
    failed = {op for kind, op, *_ in rows if kind == "create_failed"}
    changes = []
    for kind, op, version, before, after, detail in rows:
        if kind == "admitted" and op not in failed:
            changes.append((int(version), int(after) - int(before)))
        elif kind.startswith("outside_"):
            changes.append((int(version), int(_detail(detail)["delta"])))
    held = peak = 0
    for _, delta in sorted(changes):
        held += delta
        peak = max(peak, held)
    return peak


def peak_used(job_id: int) -> int:
    """The most the quota's `used` ever was: the highest value any write of it left (admissions, resyncs, outside)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(max(value_written), 0) FROM jobs_event WHERE job_id = %s "
            "AND kind IN ('admitted', 'resync', 'outside_charge', 'outside_release', 'outside_write')",
            [job_id],
        )
        return int(cursor.fetchone()[0])


def summarize(
    job_id: int, params: Mapping[str, Any], ledger: ChargeLedger, elapsed_s: float, seed: int
) -> dict[str, Any]:
    """The job's figures from its stored events and objects, and the invariant's verdict."""
    counts = _counts(job_id)
    resyncs = Resyncs.of(job_id)
    used_final, actual_final = stored(job_id)
    hard = int(params["hard"])
    gap = used_final - actual_final
    leaked = gap if gap > 0 or not resyncs.repairs else int(resyncs.repairs[-1]["released"])
    most_held = max(ledger.most_held, peak_admitted(job_id))
    over_admitted = max(ledger.over_admitted, most_held - hard, actual_final - hard, 0)
    outside_admitted, outside_released = counts.get("outside_charge", 0), counts.get("outside_release", 0)
    denied_exceeded = counts.get("denied", 0)
    denied_conflicts = counts.get("retries_exhausted", 0)
    used_peak = peak_used(job_id)
    counting = (
        f", counting {outside_admitted} admitted and {outside_released} released from outside"
        if outside_admitted or outside_released
        else ""
    )
    # Two different things: what the admitted pods held at once (the invariant), and `used`, which
    # also carries the charges of creates that failed until a resync releases them.
    if over_admitted:
        held = f"the pods admitted held {most_held} at once{counting}: {over_admitted} over hard {hard}"
    else:
        held = f"the pods admitted never held more than hard {hard} (at most {most_held} at once{counting})"
    charged = f"the charged used peaked at {used_peak}" + (
        ": it also carries the charges of creates that failed, until a resync" if counts.get("create_failed") else ""
    )
    parts = [held, charged, *resyncs.said(used_final, actual_final, params["resync_seconds"])]
    ok = over_admitted == 0 and not resyncs.quiet_wrong
    return {
        "pods": params["pods"],
        "hard": hard,
        "request": params["request"],
        "resource": RESOURCE,
        "quota": QUOTA_NAME,
        "workers": admission_workers(params),
        "admitted": counts.get("admitted", 0),
        "denied": denied_exceeded + denied_conflicts,
        "denied_exceeded_quota": denied_exceeded,
        "denied_after_retries": denied_conflicts,
        "admission_conflicts": counts.get("conflict", 0),
        "admission_retries": counts.get("retry", 0),
        "create_failures": counts.get("create_failed", 0),
        "stored_pods": counts.get("stored", 0),
        "leaked": leaked,
        "resyncs": len(resyncs.done),
        "resync_repairs": counts.get("resync", 0),
        "resync_conflicts": counts.get("resync_conflict", 0),
        "used_final": used_final,
        "actual_final": actual_final,
        "most_admitted_usage": most_held,
        "most_used": used_peak,
        "outside_admitted": outside_admitted,
        "outside_released": outside_released,
        "outside_conflicts": counts.get("outside_conflict", 0),
        "outside_writes": sum(counts.get(kind, 0) for kind in _OUTSIDE_WRITES),
        "over_admitted": over_admitted,
        "settled": bool(resyncs.quiet) and gap == 0,
        "errors": counts.get("error", 0),
        "seed": seed,
        "invariant_ok": ok,
        "invariant": "; ".join(parts),
        "duration_s": round(elapsed_s, 4),
    }
