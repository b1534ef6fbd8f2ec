"""The controller race's summary: its final figures (its last snapshot's), checked against the stored Deployment.

The replayed history must be the stored object (every version after the first is one
write the job followed). With `occ` every controller's last write must be on it and no
acknowledged write erased by another controller; with `none` the erased writes are
counted exactly, and the verdict says whose field lost its last write.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import connection

from occviz.scenarios.controllers.deployment import FIELDS, controller_name, stored
from occviz.scenarios.controllers.history import Erasure, History

if TYPE_CHECKING:
    from occviz.jobs.figures import Totals
    from occviz.jobs.models import Job


@dataclass(frozen=True)
class Writes:
    """The job's final figures, and each controller's committed writes as the store has them."""

    figures: Totals
    last: dict[int, tuple[int, int]]
    """Per controller (actor): (value, version) of its last acknowledged write."""
    by_actor: dict[int, int]

    def __call__(self, key: str) -> int:
        return int(self.figures.get(key) or 0)


def count_writes(job_id: int, figures: Totals) -> Writes:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT ON (actor) actor, value_written, version_written FROM jobs_event "
            "WHERE job_id = %s AND kind = 'committed' ORDER BY actor, version_written DESC",
            [job_id],
        )
        last = {actor: (value, version) for actor, value, version in cursor.fetchall()}
        cursor.execute(
            "SELECT actor, count(*) FROM jobs_event WHERE job_id = %s AND kind = 'committed' GROUP BY actor", [job_id]
        )
        by_actor = dict(cursor.fetchall())
    return Writes(figures, last, by_actor)


def per_controller(
    writes: Writes, history: History, on_object: list[int], from_outside: list[Erasure]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each controller's field, its writes and its last write; and those whose last write another controller erased."""
    rows, missing = [], []
    for number, value_now in enumerate(on_object, 1):
        value, version = writes.last.get(number, (None, None))
        row = {
            "controller": controller_name(number),
            "field": FIELDS[number - 1].path,
            "writes": int(writes.by_actor.get(number, 0)),
            "last_value": value,
            "last_version": version,
            "on_object": value_now,
            "last_write_present": value is None or value_now == value,
            "lost": history.lost_of(number),
            "erased_from_outside": sum(1 for erasure in from_outside if erasure.victim == number),
        }
        rows.append(row)
        # A last write that an outside writer changed afterwards is gone by their hand, not the controllers'.
        taken = any(erasure.victim == number and erasure.set_at == version for erasure in from_outside)
        if not row["last_write_present"] and not taken:
            missing.append(row)
    return rows, missing


def replay_problems(writes: Writes, history: History, final_version: int, on_object: list[int]) -> list[str]:
    """Where the replayed history and the stored object disagree (nothing, when the job followed every write)."""
    problems = []
    followed = writes("writes") + writes("outside_writes")
    if final_version - 1 != followed:
        # Written after the job stopped following outside writes (or by a writer the store does not log).
        problems.append(
            f"the object is at v{final_version} but the job followed {followed} writes: "
            f"{final_version - 1 - followed} writes it did not see"
        )
    if history.waiting or history.version != final_version or history.values != on_object:
        problems.append(f"replaying the {followed} followed writes does not give the stored object v{final_version}")
    erased = writes("lost_fields") + writes("erased_from_outside")
    if erased != len(history.lost):
        problems.append(f"{erased} erased events stored for {len(history.lost)} lost writes")
    return problems


def verdict(strategy: str, writes: Writes, lost: int, final_version: int, missing: list[dict[str, Any]]) -> str:
    """What happened to the controllers' writes, as a class can read it (invariant aside)."""
    whose = ", ".join(f"{row['controller']}'s {row['field']}" for row in missing)
    if strategy == "occ":
        if lost == 0 and not missing:
            return (
                f"every controller's last write is on the object (v{final_version}) unless erased from outside, and "
                f"none of the {writes('writes')} acknowledged writes was erased by another controller; "
                f"{writes('conflicts')} conflicts were re-read and re-applied"
            )
        gone = f"; the last write of {whose} is not on the object" if missing else ""
        return f"{lost} acknowledged writes erased by another controller{gone}"
    counted = (
        f"{writes('writes')} blind writes, {lost} acknowledged fields erased by another controller, counted "
        f"exactly (replaying the writes gives the stored object v{final_version})"
    )
    if missing:
        return (
            f"{counted}; at the end the last write of {whose} is gone: another controller wrote back the older value "
            "it had read. With none that is the lesson: a blind write erases whatever changed since its GET"
        )
    if lost:
        return (
            f"{counted}; every controller's last write is on the object, but earlier ones were erased on the way: "
            "with none, blind writes erase each other"
        )
    return f"{counted}; no write overlapped another this time: with none that is luck, not protection"


def summarize(
    job: Job, params: Mapping[str, Any], figures: Totals, row: int, history: History, elapsed_s: float, seed: int
) -> dict[str, Any]:
    """The job's final figures, checked against the stored object and the replayed history."""
    writes = count_writes(job.pk, figures)
    count = int(params["controllers"])
    from_outside = [erasure for erasure in history.lost if history.by_outside_lane(erasure.eraser)]
    final_version, content = stored(row)
    on_object = [owned.get(content) for owned in FIELDS[:count]]
    controllers, missing = per_controller(writes, history, on_object, from_outside)
    strategy = params["strategy"]
    lost = len(history.lost) - len(from_outside)
    problems = replay_problems(writes, history, final_version, on_object)
    ok = not problems and (strategy != "occ" or (lost == 0 and not missing))
    text = "; ".join(problems) if problems else verdict(strategy, writes, lost, final_version, missing)
    if writes("outside_writes") and not problems:
        by_lane = f", erasing {len(from_outside)} controller write(s)" if from_outside else ""
        text += f"; {writes('outside_writes')} write(s) from outside followed{by_lane}"
    return {
        "strategy": strategy,
        "retry": params["retry"] if strategy == "occ" else None,
        "controllers": count,
        "seconds": params["seconds"],
        "rate_per_s": params["rate_per_s"],
        "think_ms": params["think_ms"],
        "seed": seed,
        "writes": writes("writes"),
        "conflicts": writes("conflicts"),
        "retries": writes("retries"),
        "gave_up": writes("gave_up"),
        "errors": writes("errors"),
        "lost_fields": lost,
        "outside_writes": writes("outside_writes"),
        "outside_conflicts": writes("outside_conflicts"),
        "erased_from_outside": len(from_outside),
        "per_controller": controllers,
        "object_version": final_version,
        "object": content,
        "invariant_ok": ok,
        "invariant": text,
        "duration_s": round(elapsed_s, 4),
        "writes_per_s": figures.get("writes_per_s", 0.0),
        "latency_ms": figures.get("latency_ms") or {"p50": None, "p95": None, "p99": None},
    }
