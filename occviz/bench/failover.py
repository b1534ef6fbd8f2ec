"""How fast a leader election fails over after a kill, over many runs: `manage.py bench --part failover`.

Each run is a real job (`runjob leader-election ... --kill-leader-at T`), recorded like any
other; the figure is its summary's `new_leader_after_s`, from the kill to the new leader's
acquisition, against the summary's `bound_s` (LeaseDuration + 2 x 2.2 x RetryPeriod +
margin, see the leader election's summary.py) and against the shorter LeaseDuration +
2.2 x RetryPeriod the design names.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job

CLASSROOM = {"replicas": 3, "lease_duration": 3.0, "renew_deadline": 2.0, "retry_period": 0.5}


def measure_failovers(
    runs: int = 20, *, kill_at_s: float = 3.0, seconds: float = 9.0, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    """`runs` leader-election jobs with the classroom timings, each killing its leader at `kill_at_s`."""
    params = {**CLASSROOM, "seconds": seconds, "kill_leader_at": kill_at_s}
    taken: list[float] = []
    bound = short_bound = 0.0
    broken = 0
    for number in range(1, runs + 1):
        job = run_job(create_job("leader-election", params).pk)
        summary = job.summary or {}
        broken += not summary.get("invariant_ok")
        kills = [f for f in summary.get("failovers", []) if f["cause"] == "kill"]
        if not kills or kills[0]["new_leader_after_s"] is None:
            progress(f"run {number}: job {job.pk}: no failover after the kill ({summary.get('invariant')})")
            continue
        failover = kills[0]
        taken.append(float(failover["new_leader_after_s"]))
        bound = float(failover["bound_s"])
        short_bound = params["lease_duration"] + 2.2 * params["retry_period"]
        progress(f"run {number}: job {job.pk}: new leader {taken[-1]:.2f} s after the kill (bound {bound:.1f} s)")
    return {
        "runs": runs,
        "timings": CLASSROOM,
        "failovers_s": taken,
        "min_s": round(min(taken), 2) if taken else None,
        "median_s": round(statistics.median(taken), 2) if taken else None,
        "max_s": round(max(taken), 2) if taken else None,
        "bound_s": bound,
        "within_bound": sum(1 for t in taken if t <= bound),
        "lease_plus_jittered_retry_s": short_bound,
        "within_lease_plus_jittered_retry": sum(1 for t in taken if t <= short_bound),
        "invariant_broken": broken,
    }
