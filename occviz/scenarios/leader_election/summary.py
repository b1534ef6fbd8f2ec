"""What a leader election showed, from its recorded events and the Lease at the end, and how to say it.

`summarize()` gives the headless summary (leaders, failovers and their bounds,
validity by the database's clock, fencing, the damage of split brain) with its invariant;
`sentence()` and `describe_failover()` hold the wording the pages and `runjob` use.

Split brain is measured by the database's clock, which every act of a replica records
(`detail.db_time`: its Lease writes and its guarded writes): a replica acts as leader from
its acquisition to its last act before it acquires again, and a guarded write is a
non-leader's when the Lease write before it, in that clock's order, named someone else.

Failover bounds. A kill (or a pause, or a cut-off) at T leaves the leader's
last renewal written at or before T. A follower restarts its observed clock only
when it next reads the record, up to one jittered retry period (2.2 x RetryPeriod)
after that write, waits out LeaseDuration from there, and acquires on its next
try, up to another 2.2 x RetryPeriod later. So the honest worst case is
LeaseDuration + 2 x 2.2 x RetryPeriod after T, and that is the bound used, plus
FAILOVER_MARGIN_S for statements, reconnections and thread scheduling (the
shorter LeaseDuration + 2.2 x RetryPeriod holds only for a follower that happened
to read the last renewal as it was written). After a graceful stop that released
the lease, the first follower to try again sees an empty holder and takes it at
once: 2.2 x RetryPeriod + the margin. A stop without release is bounded as a kill.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from django.db import connection

from occviz.scenarios.base import fill
from occviz.scenarios.leader_election.elector import JITTER_FACTOR, identity

if TYPE_CHECKING:
    from occviz.scenarios.leader_election.elector import LeaderElectionConfig
    from occviz.store.models import Lease

Event = Mapping[str, Any]

FAILOVER_MARGIN_S: Final = 0.5
"""Added to every failover bound: statement round trips, a reconnection, threads waiting for the CPU."""

# The controls that can end a leadership, as a failover names its cause.
CAUSES: Final = {"killed": "kill", "stopped": "stop", "paused": "pause", "cut_off": "cut-off", "starved": "starvation"}
_ENDS_LEADERSHIP: Final = {"lost", "released", "killed", "stopped"}

_EVENT_COLUMNS = (
    "seq, t_ms, actor, op, attempt, kind, row, version_read, version_written, value_read, value_written, "
    "duration_ms, latency_ms, detail"
)


def read_events(job_id: int) -> list[dict[str, Any]]:
    """A job's stored events, in order, as dicts (the `jobs_event` view's columns)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {_EVENT_COLUMNS} FROM jobs_event WHERE job_id = %s ORDER BY seq", [job_id])
        names = [column.name for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def detail(event: Event) -> dict[str, Any]:
    """An event's detail as a dict (the view may give jsonb back as text)."""
    value = event.get("detail")
    if isinstance(value, str):
        value = json.loads(value)
    return value or {}


def _s(event: Event) -> float:
    return float(event["t_ms"]) / 1000.0


def _name(event: Event) -> str:
    """The replica's identity, or an outside writer's lane (its detail names it)."""
    return detail(event).get("lane") or identity(int(event["actor"]))


def failover_bound_s(cause: str, config: LeaderElectionConfig, *, released: bool = False) -> float:
    """The longest a failover of `cause` may take (module docstring: why)."""
    jittered = (1.0 + JITTER_FACTOR) * config.retry_period
    if cause == "stop" and released:
        return jittered + FAILOVER_MARGIN_S
    return config.lease_duration + 2 * jittered + FAILOVER_MARGIN_S


def leaderships(events: Sequence[Event], end_s: float) -> list[dict[str, Any]]:
    """Each leadership as its replica lived it: from `acquired` to lost, released, killed, stopped, or the end.

    A paused leader's leadership spans its pause (it still believes it leads) and can
    overlap its successor's: that is the stale leader. Whether two leaders were *valid*
    at once is judged by the database's clock instead (`max_valid_leaders`).
    """
    result: list[dict[str, Any]] = []
    open_: dict[int, dict[str, Any]] = {}
    for event in events:
        actor, kind = int(event["actor"]), event["kind"]
        if kind == "acquired":
            # An outside writer's leadership ends when another takes the lease: its stop is not seen.
            for other, leadership in list(open_.items()):
                if other != actor and leadership["outside"]:
                    leadership.update(to_s=round(_s(event), 3), ended="taken over")
                    del open_[other]
        if kind == "acquired" and actor not in open_:
            open_[actor] = {
                "identity": _name(event),
                "from_s": round(_s(event), 3),
                "to_s": None,
                "transition": event["value_written"],
                "ended": None,
                "outside": bool(detail(event).get("lane")),
            }
            result.append(open_[actor])
        elif kind in _ENDS_LEADERSHIP and actor in open_:
            leadership = open_.pop(actor)
            leadership.update(to_s=round(_s(event), 3), ended=kind)
    for leadership in open_.values():
        leadership.update(to_s=round(end_s, 3), ended="end")
    return result


def _db_time(event: Event) -> datetime:
    return datetime.fromisoformat(detail(event)["db_time"])


def valid_intervals(
    events: Sequence[Event], config: LeaderElectionConfig
) -> dict[int, list[tuple[datetime, datetime]]]:
    """Per replica, when it was a valid leader by the database's clock.

    Valid from the database time of its acquiring write until LeaseDuration after its
    last renewal (or until it released, if sooner): a follower only takes over once it
    has seen that last renewal and waited LeaseDuration by its own clock.
    """
    intervals: dict[int, list[tuple[datetime, datetime]]] = {}
    current: dict[int, tuple[datetime, datetime]] = {}  # actor -> (valid since, last write)
    leases: dict[int, timedelta] = {}
    for event in events:
        kind = event["kind"]
        if kind not in ("acquired", "renewed", "released"):
            continue
        actor, at = int(event["actor"]), _db_time(event)
        # An outside client's lease lasts what it wrote (its own LeaseDuration), a replica's the job's.
        lease = leases[actor] = timedelta(seconds=detail(event).get("lease_s") or config.lease_duration)
        held = current.get(actor)
        if kind == "released":
            if held is not None:
                intervals.setdefault(actor, []).append((held[0], min(at, held[1] + lease)))
                del current[actor]
        elif held is not None and at <= held[1] + lease:
            current[actor] = (held[0], at)  # a renewal, or re-taking a lease that still named it
        else:
            if held is not None:
                intervals.setdefault(actor, []).append((held[0], held[1] + lease))
            current[actor] = (at, at)
    for actor, (since, last) in current.items():
        intervals.setdefault(actor, []).append((since, last + leases[actor]))
    return intervals


def max_valid_leaders(events: Sequence[Event], config: LeaderElectionConfig) -> tuple[int, str]:
    """The most replicas valid as leader at one instant by the database's clock, and who, when more than one."""
    edges: list[tuple[datetime, int, int]] = []  # (time, +1 start / -1 end, actor); ends sort first
    for actor, spans in valid_intervals(events, config).items():
        for since, until in spans:
            edges.append((since, 1, actor))
            edges.append((until, -1, actor))
    edges.sort(key=lambda edge: (edge[0], edge[1]))
    names = {int(e["actor"]): _name(e) for e in events}
    valid: dict[int, int] = {}
    most, who = 0, ""
    for at, step, actor in edges:
        valid[actor] = valid.get(actor, 0) + step
        # One replica's own overlapping spans (it re-took its own lease) are still one leader.
        now = sum(1 for count in valid.values() if count > 0)
        if now > most:
            most = now
            holders = ", ".join(names.get(a) or identity(a) for a, count in sorted(valid.items()) if count > 0)
            who = f"{holders} at {at.isoformat()}"
    return most, who


# What a replica does as leader, each with the database's clock at its write (detail.db_time).
_ACTS: Final = ("acquired", "renewed", "released", "guarded_write", "fenced")
_LEASE_WRITES: Final = ("acquired", "renewed", "released")


def _acts(events: Sequence[Event], kinds: Sequence[str] = _ACTS) -> list[Event]:
    """Events of `kinds` that carry the database's clock, in the order of that clock."""
    timed = [e for e in events if e["kind"] in kinds and detail(e).get("db_time")]
    return sorted(timed, key=_db_time)


def acting_intervals(events: Sequence[Event]) -> dict[int, list[tuple[datetime, datetime]]]:
    """Per replica, when it acted as leader by the database's clock.

    From each acquisition to its last act (renewal, release, guarded write, fenced or not)
    before it acquires again: a replica that keeps writing after it stepped down, or after it
    woke from a pause, acted as leader until its last write.
    """
    intervals: dict[int, list[tuple[datetime, datetime]]] = {}
    for event in _acts(events):
        actor, at = int(event["actor"]), _db_time(event)
        spans = intervals.setdefault(actor, [])
        if event["kind"] == "acquired":
            spans.append((at, at))
        elif spans:
            spans[-1] = (spans[-1][0], at)
    return {actor: spans for actor, spans in intervals.items() if spans}


def split_brain_s(events: Sequence[Event]) -> float:
    """Seconds, by the database's clock, during which two or more replicas acted as leader at once."""
    edges = sorted(
        (
            edge
            for spans in acting_intervals(events).values()
            for since, until in spans
            for edge in ((since, 1), (until, -1))
        ),
        key=lambda edge: (edge[0], edge[1]),
    )
    acting, since, total = 0, None, timedelta()
    for at, step in edges:
        acting += step
        if acting >= 2 and since is None:
            since = at
        elif acting < 2 and since is not None:
            total += at - since
            since = None
    return total.total_seconds()


def non_leader_writes(events: Sequence[Event]) -> tuple[int, int]:
    """Guarded writes by a replica that was not the Lease's holder at that moment: (landed, fenced).

    The holder at a moment is the one the last Lease write before it (by the database's clock) named.
    """
    holder: int | None = None
    landed = fenced = 0
    for event in _acts(events):
        kind, actor = event["kind"], int(event["actor"])
        if kind in _LEASE_WRITES:
            holder = None if kind == "released" else actor
        elif actor != holder:
            landed += kind == "guarded_write"
            fenced += kind == "fenced"
    return landed, fenced


def stale_writes_landed(events: Sequence[Event]) -> int:
    """Guarded writes that landed with a token older than one already written (the fencing must make it 0)."""
    landed = sorted((e for e in events if e["kind"] == "guarded_write"), key=lambda e: e["version_written"])
    newest = None
    stale = 0
    for event in landed:
        token = event["value_written"]
        if newest is not None and token < newest:
            stale += 1
        newest = token if newest is None else max(newest, token)
    return stale


def _others_alive(events: Sequence[Event], actor: int) -> bool:
    """Whether a replica other than `actor` was still running after `events`."""
    seen = {int(e["actor"]) for e in events}
    gone = {int(e["actor"]) for e in events if e["kind"] in ("killed", "stopped")}
    return bool(seen - gone - {actor})


def failovers(events: Sequence[Event], config: LeaderElectionConfig, end_s: float) -> list[dict[str, Any]]:
    """Each control that hit the leader and cost it the lease, with how long until another replica led."""
    result = []
    for index, event in enumerate(events):
        cause = CAUSES.get(event["kind"])
        if cause is None or not detail(event).get("leading"):
            continue
        actor, at_s = int(event["actor"]), _s(event)
        released = False
        successor: Event | None = None
        kept = False
        for later in events[index + 1 :]:
            same = int(later["actor"]) == actor
            if same and later["kind"] == "released":
                released = True
            elif same and later["kind"] in ("acquired", "renewed"):
                kept = True  # it woke, or got through again, in time to keep its lease: no failover
                break
            elif not same and later["kind"] == "acquired":
                successor = later
                break
        if kept:
            continue
        bound_s = failover_bound_s(cause, config, released=released)
        after_s = None if successor is None else round(_s(successor) - at_s, 3)
        if successor is not None and detail(successor).get("lane"):
            within: bool | None = None  # an outside client retries on its own timings: nothing to judge
        elif after_s is not None:
            within = after_s <= bound_s
        elif end_s < at_s + bound_s or not _others_alive(events[: index + 1], actor):
            within = None  # the job ended first, or no replica was left to take over: nothing to judge
        else:
            within = False
        result.append(
            {
                "cause": cause,
                "at_s": round(at_s, 3),
                "new_leader_after_s": after_s,
                "bound_s": round(bound_s, 3),
                "leader": _name(event),
                "new_leader": None if successor is None else _name(successor),
                "transition": None if successor is None else successor["value_written"],
                "within_bound": within,
                # The process that was killed or stopped, and the signal (None: a thread, or no signal).
                "pid": detail(event).get("pid"),
                "signal": detail(event).get("signal"),
            }
        )
    return result


def measure_damage(split_s: float, landed: int, fenced: int, transitions: int, step_downs: int = 0) -> str:
    """E.g. "two leaders for 3.2 s; 14 writes by a replica that was not leading landed; 5 lease transitions"."""
    words = [f"two leaders for {split_s:.1f} s" if split_s else "never two replicas acting as leader at once"]
    if landed or not fenced:
        words.append(f"{landed} write{'s' * (landed != 1)} by a replica that was not leading landed")
    if fenced:
        words.append(f"{fenced} write{'s' * (fenced != 1)} by a replica that was not leading fenced")
    if step_downs:
        words.append(f"{step_downs} leader{'s' * (step_downs != 1)} stepped down")
    words.append(f"{transitions} lease transition{'s' * (transitions != 1)}")
    return "; ".join(words)


def summarize(
    events: Sequence[Event],
    lease: Lease,
    config: LeaderElectionConfig,
    *,
    replicas: int | None = None,
    incident: bool = False,
    fencing: bool = True,
) -> dict[str, Any]:
    """The job's headless summary: leaders, failovers, validity by the database's clock, fencing, invariant.

    `events` as read from `jobs_event` (or recorded in a list), `lease` the job's Lease as
    it is now. `replicas` defaults to the highest replica number seen in the events.
    `incident`: the replicas were made to misbehave (work after losing the lease, a slow
    shutdown, mixed lease durations, starvation), so two leaders are the damage to measure,
    not a broken invariant; `fencing` off, stale writes landing is that damage too.
    """
    events = sorted(events, key=lambda e: (e["t_ms"], e.get("seq") or 0))
    end_s = _s(events[-1]) if events else 0.0
    counts: dict[str, int] = {}
    for event in events:
        counts[event["kind"]] = counts.get(event["kind"], 0) + 1
    acquire_attempts = (
        counts.get("acquired", 0)
        + counts.get("backed_off", 0)
        + sum(
            1
            for e in events
            if e["kind"] in ("conflict", "db_error")
            and detail(e).get("phase") == "acquire"
            and detail(e).get("path") != "fast"
        )
    )
    led = leaderships(events, end_s)
    moved = failovers(events, config, end_s)
    most, who = max_valid_leaders(events, config)
    landed_stale = stale_writes_landed(events)
    split_s = round(split_brain_s(events), 3)
    landed_by_non_leader, fenced_by_non_leader = non_leader_writes(events)
    # Each transition is one acquisition by a new holder; a replica that re-took a lease still
    # naming it wrote the same number again, so distinct numbers are what the Lease counted.
    transitions_seen = len({e["value_written"] for e in events if e["kind"] == "acquired"})
    transitions = lease.lease_transitions

    problems = []
    if most > 1 and not incident:
        problems.append(f"{most} valid leaders at once by the database's clock ({who})")
    for failover in moved:
        if failover["within_bound"] is False and not incident:
            took = failover["new_leader_after_s"]
            problems.append(
                f"the failover after {failover['leader']}'s {failover['cause']} at {failover['at_s']:.1f} s took "
                + ("forever" if took is None else f"{took:.1f} s")
                + f", more than its bound of {failover['bound_s']:.1f} s"
            )
    if landed_stale and fencing:
        problems.append(f"{landed_stale} stale guarded writes landed despite the fencing")
    if transitions_seen != transitions:
        problems.append(f"the events show {transitions_seen} transitions, the Lease counts {transitions}")
    if problems:
        verdict = "; ".join(problems)
    elif incident or not fencing:
        verdict = measure_damage(
            split_s, landed_by_non_leader, fenced_by_non_leader, transitions, counts.get("lost", 0)
        )
        verdict += ", as the events show" if transitions else ""
    else:
        timed = [f for f in moved if f["new_leader_after_s"] is not None]
        verdict = (
            "never two valid leaders by the database's clock"
            + (
                f"; {len(timed)} failover{'s' if len(timed) != 1 else ''} within bound ("
                + ", ".join(f"{f['new_leader_after_s']:.1f} s of {f['bound_s']:.1f}" for f in timed)
                + ")"
                if timed
                else ""
            )
            + f"; {counts.get('fenced', 0)} stale writes fenced, none landed"
            + f"; {transitions} transitions, as the events show"
        )
        if split_s:
            verdict += f"; a stale replica acted as leader next to another for {split_s:.1f} s"
    return {
        "replicas": replicas if replicas is not None else max((int(e["actor"]) for e in events), default=0),
        "transitions": transitions,
        "leaders": led,
        "failovers": moved,
        "max_leaders_at_once": most,
        "renewals": counts.get("renewed", 0),
        "acquire_attempts": acquire_attempts,
        "conflicts": counts.get("conflict", 0),
        "fenced_writes_rejected": counts.get("fenced", 0),
        "fenced_writes_landed": landed_stale,
        "split_brain_s": split_s,
        "non_leader_writes_landed": landed_by_non_leader,
        "non_leader_writes_fenced": fenced_by_non_leader,
        "invariant_ok": not problems,
        "invariant": verdict,
    }


# -- the wording --------------------------------------------------------------------------------------

# How each kind reads: templates in the scenarios' placeholder language (occviz.scenarios.base.fill:
# `{who}`, `{value_written}`, `{detail.holder}`, `{detail.seconds:s}`), the first whose values are
# all present being used, so the same words serve the pages, the browser and `sentence()` here.
SENTENCES: Final[dict[str, tuple[str, ...]]] = {
    "acquired": (
        "{who} acquired the lease from {detail.holder} (transition {value_written}).",
        "{who} acquired the lease (transition {value_written}).",
    ),
    "renewed": ("{who} renewed the lease.",),
    "backed_off": ("{who} backed off: {detail.holder}'s lease is still valid.",),
    "conflict": ("{who} lost the compare-and-swap on the lease: version {version_read} had moved on.",),
    "renew_failed": ("{who} could not renew: {detail.reason}.",),
    "lost": ("{who} stepped down: no renewal for {detail.since_renew_s:s} (RenewDeadline).",),
    "released": ("{who} released the lease.",),
    "guarded_write": ("{who} did its guarded write with token {value_written}.",),
    "fenced": ("{who}'s write with token {value_written} was fenced: the counter has seen token {value_read}.",),
    "db_error": ("{who}: database error ({detail.phase}): {detail.message}",),
    "reconnected": ("{who} reconnected to the database.",),
    "killed": (
        "{who} (process {detail.pid}) was killed with {detail.signal}.",
        "{who}'s process {detail.pid} died: killed from outside the job.",
        "{who} was killed.",
    ),
    "stopped": ("{who} was stopped gracefully.",),
    "paused": (
        "{who} (process {detail.pid}) was stopped with {detail.signal} for {detail.seconds:s}: a stop-the-world pause.",
        "{who} froze for {detail.seconds:s} (a stop-the-world pause).",
    ),
    "woke": (
        "{who} (process {detail.pid}) woke from a {detail.seconds:s} pause believing it leads (token {detail.token}).",
        "{who} woke from a {detail.seconds:s} pause believing it leads (token {detail.token}).",
        "{who} woke from a {detail.seconds:s} pause as a follower.",
    ),
    "cut_off": ("{who} was cut off from the database for {detail.seconds:s}.",),
    "skewed": (
        "{who}'s clock now runs {detail.ahead_s} s ahead.",
        "{who}'s clock now runs {detail.behind_s} s behind.",
        "{who}'s clock is right again.",
    ),
    "added": ("{who} joined the election.",),
    "control_failed": ("The {detail.control} of {who} could not be applied: {detail.error}",),
    "error": ("{who} failed: {detail.message}",),
    "starved": ("{who} was starved of CPU: its renewal comes {detail.seconds:s} late.",),
    "working_on": ("{who}'s work loop runs on {detail.why}, for {detail.seconds:s}, with token {detail.token}.",),
    "work_stopped": ("{who}'s work loop stopped at last: no more writes with token {detail.token}.",),
}

_CAUSE_WORDS: Final = {
    "kill": "was killed",
    "stop": "was stopped",
    "pause": "was paused",
    "cut-off": "was cut off from the database",
    "starvation": "was starved of CPU",
}


def sentence(event: Event, who: str | None = None) -> str:
    """One event in words, e.g. "replica-1's write with token 2 was fenced: the counter has seen token 3."."""
    who = who or _name(event)
    for template in SENTENCES.get(event["kind"], ()):
        text = fill(template, {**event, "detail": detail(event)}, who)
        if text is not None:
            return text
    return f"{who}: {event['kind']}."


def describe_failover(failover: Mapping[str, Any]) -> str:
    """E.g. "replica-2 acquired the lease (transition 3), 4.1 s after replica-1 (process 4242) was killed with SIGKILL
    (bound 6.9 s)."."""
    process = f" (process {failover['pid']})" if failover.get("pid") else ""
    signal = f" with {failover['signal']}" if failover.get("signal") else ""
    what = f"{failover['leader']}{process} {_CAUSE_WORDS[failover['cause']]}{signal}"
    if failover["new_leader"] is None:
        return f"No replica acquired the lease after {what} at {failover['at_s']:.1f} s."
    return (
        f"{failover['new_leader']} acquired the lease (transition {failover['transition']}), "
        f"{failover['new_leader_after_s']:.1f} s after {what} (bound {failover['bound_s']:.1f} s)."
    )
