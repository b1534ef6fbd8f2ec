"""Leader election: the declaration (form, presets, kinds, figures, controls).

R replicas run client-go's leader election on the job's Lease: one replica's algorithm
is elector.py, the replicas as a group with their failure controls actors.py, a job of
it job.py, and the summary with its invariant, from the recorded events and the Lease,
summary.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django import forms

from occviz.scenarios.base import (
    ERROR,
    Control,
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
from occviz.scenarios.leader_election import job
from occviz.scenarios.leader_election.elector import LeaderElectionConfig, identity
from occviz.scenarios.leader_election.job import ADDED_REPLICAS
from occviz.scenarios.leader_election.summary import SENTENCES
from occviz.scenarios.network import (
    NETWORK_COMPARED,
    NETWORK_FIELDS,
    clean_network,
    jitter_field,
    latency_changed_kind,
    latency_control,
    latency_field,
    network_setup,
)
from occviz.store.models import Lease, conflict_message

if TYPE_CHECKING:
    from occviz.jobs.context import JobContext

MAX_REPLICAS = 16
REPLICAS_AS = (
    ("processes", "processes of their own (kill: SIGKILL, pause: SIGSTOP)"),
    ("threads", "threads of the job's process"),
)
_SKEW = re.compile(r"^(?:replica-)?(\d{1,3})=([+-]?\d{1,5}(?:\.\d{1,3})?)$")
_LEASE_DURATION = re.compile(r"^(?:replica-)?(\d{1,3})=(\d{1,5}(?:\.\d{1,3})?)$")


def _seconds_field(
    label: str, initial: float | None, help_text: str = "", *, minimum: float = 0.0
) -> DecimalNumberField:
    return DecimalNumberField(
        label=label, min_value=minimum, max_value=86_400, required=False, initial=initial, help_text=help_text
    )


class LeaderElectionForm(ScenarioForm):
    replicas = WholeNumberField(min_value=1, max_value=MAX_REPLICAS, initial=3, help_text="1 to 16.")
    lease_duration = _seconds_field("Lease duration (s)", 15.0, "client-go LeaseDuration.", minimum=0.1)
    renew_deadline = _seconds_field("Renew deadline (s)", 10.0, "client-go RenewDeadline.", minimum=0.1)
    retry_period = _seconds_field("Retry period (s)", 2.0, "client-go RetryPeriod.", minimum=0.05)
    seconds = _seconds_field("Run for (s)", 30.0, "How long the election runs.", minimum=1.0)
    kill_leader_at = _seconds_field("Kill the leader at (s)", None, "It stops without releasing the lease.")
    stop_leader_at = _seconds_field("Stop the leader at (s)", None, "Gracefully: it releases with ReleaseOnCancel.")
    pause_leader_at = _seconds_field("Pause the leader at (s)", None, "A stop-the-world pause.")
    pause_for = _seconds_field("Pause for (s)", None, "Default: twice the lease duration.", minimum=0.1)
    cut_off_leader_at = _seconds_field("Cut the leader off at (s)", None, "From the database.")
    cut_off_for = _seconds_field("Cut off for (s)", None, "Default: the lease duration.", minimum=0.1)
    skew = forms.CharField(
        required=False,
        max_length=400,
        help_text="Clock skews, e.g. replica-2=30 replica-3=-5 (seconds, ahead or behind).",
    )
    no_fencing = forms.BooleanField(
        required=False, label="No fencing", help_text="Guarded writes carry a token nobody checks: stale writes land."
    )
    work_after_loss = _seconds_field(
        "Work after losing the lease (s)",
        None,
        "Work bound to the process, not to the leadership: it writes this long after stepping down.",
        minimum=0.1,
    )
    shutdown_for = _seconds_field(
        "Shutdown takes (s)",
        None,
        "A stopped leader stops renewing but writes this long before it releases.",
        minimum=0.1,
    )
    lease_durations = forms.CharField(
        required=False,
        max_length=400,
        label="Own lease durations",
        help_text="e.g. replica-2=0.5: that replica judges every lease by its own LeaseDuration (seconds).",
    )
    starve_leader_every = _seconds_field(
        "Starve the leader every (s)", None, "CPU starvation in bursts: the leader's renewal comes late.", minimum=0.5
    )
    starve_for = _seconds_field(
        "Starve for (s)", None, "Default: the lease duration plus the renew deadline.", minimum=0.1
    )
    release_on_cancel = forms.BooleanField(
        required=False, label="Release on cancel", help_text="client-go ReleaseOnCancel: a stopping leader releases."
    )
    seed = WholeNumberField(required=False, min_value=0, max_value=2**32, help_text="Seed for the jitter.")
    replicas_as = forms.ChoiceField(
        choices=REPLICAS_AS,
        required=False,
        initial="processes",
        label="Replicas run as",
        help_text="Processes: kill is SIGKILL, pause is SIGSTOP. Threads: quicker to start.",
    )
    latency_ms = latency_field("replica", "20 for every replica, 20 replica-2=50 for replica-2 at 50")
    jitter_ms = jitter_field()

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        clean_network(self, data, data.get("replicas"), "replica", identity)
        if self.errors:
            return data
        config = LeaderElectionConfig(data["lease_duration"], data["renew_deadline"], data["retry_period"])
        for error in config.validate():
            target = "lease_duration" if error.startswith("leaseDuration") else "renew_deadline"
            self.add_error(target, f"{error} (client-go's rule: LeaseDuration > RenewDeadline > 1.2 x RetryPeriod).")
        check_limit(self, "replicas", data["replicas"], "OCCVIZ_MAX_WRITERS", "replicas")
        check_limit(self, "seconds", data["seconds"], "OCCVIZ_MAX_SECONDS", "seconds")
        for name in ("kill_leader_at", "stop_leader_at", "pause_leader_at", "cut_off_leader_at"):
            at = data.get(name)
            if at is not None and at >= data["seconds"]:
                self.add_error(name, f"{at:g} s is not within the {data['seconds']:g} s the election runs.")
        if data.get("pause_for") is not None and data.get("pause_leader_at") is None:
            self.add_error("pause_for", "Give the moment of the pause too (pause the leader at).")
        if data.get("cut_off_for") is not None and data.get("cut_off_leader_at") is None:
            self.add_error("cut_off_for", "Give the moment of the cut-off too (cut the leader off at).")
        if data.get("pause_leader_at") is not None and data.get("pause_for") is None:
            data["pause_for"] = 2 * data["lease_duration"]
        if data.get("cut_off_leader_at") is not None and data.get("cut_off_for") is None:
            data["cut_off_for"] = data["lease_duration"]
        data["skew"] = self._skews(data.get("skew") or "", data["replicas"])
        data["lease_durations"] = self._lease_durations(data.get("lease_durations") or "", data)
        if data.get("shutdown_for") is not None and data.get("stop_leader_at") is None:
            self.add_error("shutdown_for", "Give the moment of the stop too (stop the leader at).")
        if data.get("starve_for") is not None and data.get("starve_leader_every") is None:
            self.add_error("starve_for", "Give how often too (starve the leader every).")
        if data.get("starve_leader_every") is not None:
            if data.get("starve_for") is None:
                data["starve_for"] = data["lease_duration"] + data["renew_deadline"]
            if data["starve_for"] >= data["starve_leader_every"]:
                self.add_error("starve_for", "A starvation must end before the next one (starve the leader every).")
            if data["starve_leader_every"] >= data["seconds"]:
                self.add_error("starve_leader_every", f"Not within the {data['seconds']:g} s the election runs.")
        return data

    def _lease_durations(self, raw: str, data: Mapping[str, Any]) -> str:
        """`replica-2=0.5` checked against the replicas and client-go's rules, written back in that form."""
        durations: dict[int, float] = {}
        for word in raw.replace(",", " ").split():
            found = _LEASE_DURATION.match(word) if word.isascii() else None
            if found is None:
                self.add_error("lease_durations", f"{word!r} is not REPLICA=SECONDS (e.g. replica-2=0.5).")
                continue
            number, seconds = int(found[1]), float(found[2])
            if not 1 <= number <= data["replicas"]:
                self.add_error(
                    "lease_durations",
                    f"unknown replica {word.split('=')[0]!r}: the job has replicas 1 to {data['replicas']}.",
                )
            elif not 0.1 <= seconds <= 3600:
                self.add_error("lease_durations", f"{word!r}: a lease duration from 0.1 s to an hour.")
            else:
                durations[number] = seconds
        return " ".join(f"{identity(n)}={s:g}" for n, s in sorted(durations.items()))

    def _skews(self, raw: str, replicas: int) -> str:
        """`replica-2=30 replica-3=-5` checked against the replicas, written back in that form."""
        skews: dict[int, float] = {}
        for word in raw.replace(",", " ").split():
            found = _SKEW.match(word) if word.isascii() else None
            if found is None:
                self.add_error("skew", f"{word!r} is not REPLICA=SECONDS (e.g. replica-2=30).")
                continue
            number, seconds = int(found[1]), float(found[2])
            if not 1 <= number <= replicas:
                self.add_error("skew", f"unknown replica {word.split('=')[0]!r}: the job has replicas 1 to {replicas}.")
            elif abs(seconds) > 3600:
                self.add_error("skew", f"{word!r}: a skew of at most an hour either way.")
            else:
                skews[number] = seconds
        return " ".join(f"{identity(n)}={s:g}" for n, s in sorted(skews.items()))


_LEASE_409 = f"409 Conflict: {conflict_message(Lease, 'leader')}"

# An outside writer's events say who wrote, and how (only they carry detail.via_words).
_BY = "{who} ({detail.writer} via {detail.via_words})"
_OUTSIDE = {
    "acquired": (
        f"{_BY} acquired the lease from {{detail.holder}} (transition {{value_written}}).",
        f"{_BY} acquired the lease (transition {{value_written}}).",
    ),
    "renewed": (f"{_BY} renewed the lease.",),
    "released": (f"{_BY} released the lease.",),
    "conflict": (f"{_BY}: conflict, had v{{version_read}}, stored v{{detail.stored_version}}.",),
}

# Said first when the acquisition follows a leader taken down (FailoverNarrator).
_FAILOVER = "{who} acquired the lease (transition {value_written}), {detail.after_s} s after {detail.after}."


# What a class reads as each of these happens, and what it is in Kubernetes (client-go's leaderelection);
# with the noun its events are counted by when they come faster than captions can be read, and whether
# it is a key moment, pinned in the page's list.
_CAPTIONS: dict[str, tuple[tuple[str, ...], str, bool]] = {
    "acquired": (
        (
            f"{_BY} took the lease (transition {{value_written}}): an outside client's update won the "
            "compare-and-swap on the Lease, as any client holding the RBAC to update it can.",
            "{who} waited out {detail.holder}'s lease and took it (transition {value_written}), {detail.after_s} s "
            "after {detail.after}: timed by its own clock since it last saw the Lease change, never by the holder's "
            "renewTime.",
            "{who} took the released lease (transition {value_written}) {detail.after_s} s after {detail.after}: "
            "an empty holderIdentity needs no waiting, so the handover takes one RetryPeriod.",
            "{who} waited out {detail.holder}'s lease and took it (transition {value_written}): LeaseDuration by its "
            "own clock since it last saw the Lease change, never by the holder's renewTime.",
            "{who} acquired the lease (transition {value_written}): its update of the Lease won the "
            "compare-and-swap, so it is the leader client-go's OnStartedLeading starts.",
        ),
        "acquisitions",
        True,
    ),
    "renewed": (
        (
            "{who} renewed the lease: as leader it rewrites the Lease's renewTime every RetryPeriod, and each "
            "write moves resourceVersion, which tells followers the holder is alive.",
        ),
        "renewals",
        False,
    ),
    "backed_off": (
        (
            "{who} backed off: {detail.holder} holds a lease it saw change less than LeaseDuration ago, so "
            "client-go's tryAcquireOrRenew gives up and tries again after RetryPeriod.",
        ),
        "back-offs",
        False,
    ),
    "conflict": (
        (
            f"{_BY} got 409 Conflict: it had read v{{version_read}}, the Lease was at v{{detail.stored_version}}.",
            "{who}'s update of the Lease matched no row: v{version_read} had moved on. In Kubernetes this is the "
            "409 Conflict the elector gets, and it tries again after RetryPeriod.",
        ),
        "conflicts",
        False,
    ),
    "renew_failed": (
        (
            "{who} could not renew ({detail.reason}): it retries every RetryPeriod, and steps down once "
            "RenewDeadline has passed without a renewal.",
        ),
        "failed renewals",
        False,
    ),
    "lost": (
        (
            "{who} stepped down: {detail.since_renew_s:s} without a renewal is past RenewDeadline. client-go calls "
            "OnStoppedLeading, and kube-controller-manager exits.",
        ),
        "step-downs",
        True,
    ),
    "released": (
        (
            f"{_BY} released the lease.",
            "{who} released the lease (ReleaseOnCancel): it wrote an empty holderIdentity, so a follower takes it "
            "on its next try instead of waiting out LeaseDuration.",
        ),
        "releases",
        True,
    ),
    "guarded_write": (
        (
            "{who} wrote with fencing token {value_written} (the Lease's leaseTransitions when it acquired): the "
            "guarded row keeps the newest token it has seen.",
        ),
        "guarded writes",
        False,
    ),
    "fenced": (
        (
            "{who}'s write with token {value_written} was fenced: the row has seen token {value_read}, so a stale "
            "leader writes nothing. client-go's leader election does not fence: a controller has to.",
        ),
        "fenced writes",
        True,
    ),
    "killed": (
        (
            "{who}'s process {detail.pid} was killed with {detail.signal} (a crashed pod, kill -9): it does not "
            "release the Lease, so the others must wait out LeaseDuration from the last change they saw.",
            "{who} was killed (a crashed pod, kill -9): it does not release the Lease, so the others must wait "
            "out LeaseDuration from the last change they saw.",
        ),
        "kills",
        True,
    ),
    "stopped": (
        (
            "{who} was stopped gracefully (SIGTERM): with ReleaseOnCancel it empties the Lease for a fast handover; "
            "without, the others wait out LeaseDuration.",
        ),
        "stops",
        True,
    ),
    "paused": (
        (
            "{who}'s process {detail.pid} was stopped with {detail.signal} for {detail.seconds:s} (a long GC pause, "
            "a suspended VM): it cannot renew, and will not know that time passed.",
            "{who} froze for {detail.seconds:s} (a long GC pause, a suspended VM): it cannot renew, and will not "
            "know that time passed.",
        ),
        "pauses",
        True,
    ),
    "woke": (
        (
            "{who}'s process {detail.pid} got SIGCONT after {detail.seconds:s} and woke believing it still leads "
            "(token {detail.token}): its lease may have run out meanwhile, and only the fencing token stops its next "
            "write.",
            "{who} woke from {detail.seconds:s} believing it still leads (token {detail.token}): its lease may have "
            "run out meanwhile, and only the fencing token stops its next write.",
            "{who} woke from {detail.seconds:s} as a follower: it goes back to trying every RetryPeriod.",
        ),
        "wake-ups",
        True,
    ),
    "cut_off": (
        (
            "{who} was cut off from the database for {detail.seconds:s} (a partition from the API server): it "
            "cannot renew, and steps down after RenewDeadline.",
        ),
        "cut-offs",
        True,
    ),
    "skewed": (
        (
            "{who}'s clock now runs {detail.ahead_s} s ahead: the renewTime it writes lies, but every replica "
            "times the lease by its own clock.",
            "{who}'s clock now runs {detail.behind_s} s behind: the renewTime it writes lies, but every replica "
            "times the lease by its own clock.",
            "{who}'s clock is right again.",
        ),
        "clock skews",
        False,
    ),
    "db_error": (
        (
            "{who} got a database error ({detail.phase}): {detail.message}. In Kubernetes, the API server "
            "unreachable: the elector keeps trying every RetryPeriod.",
        ),
        "database errors",
        False,
    ),
    "added": (("{who} joined the election: it backs off while the lease is held, as a new pod does.",), "joins", False),
    "starved": (
        (
            "{who} is starved of CPU for {detail.seconds:s} (a throttled container, a noisy neighbour): its renewal "
            "comes after RenewDeadline, client-go's timeout has expired, and it steps down.",
        ),
        "starvations",
        True,
    ),
    "working_on": (
        (
            "{who}'s work loop runs on {detail.why}, for {detail.seconds:s}: its work is bound to the process, not "
            "to its leadership, so it keeps writing with token {detail.token} while another replica may lead.",
        ),
        "works on",
        True,
    ),
    "work_stopped": (
        ("{who}'s work loop stopped at last: no more writes with token {detail.token}.",),
        "work stops",
        False,
    ),
    "control_failed": (
        ("The {detail.control} of {who} could not be applied: {detail.error}",),
        "refused controls",
        False,
    ),
}


def _kind(name: str, label: str, color: str, mark: str, *, first: tuple[str, ...] = (), **options: Any) -> EventKind:
    captions, plural, key = _CAPTIONS.get(name, ((), "", False))
    return EventKind(
        name, label, (*first, *SENTENCES[name]), color, mark, captions=captions, plural=plural, key=key, **options
    )


class LeaderElectionScenario(Scenario):
    name = "leader-election"
    title = "Leader election"
    description = (
        "Replicas contend for one Lease as client-go's leader election does: kill, stop, pause or cut off "
        "the leader and watch the failover, the fencing of a stale leader, the transitions."
    )
    form_class = LeaderElectionForm
    sections = {
        "Replicas and lease": ("replicas", "lease_duration", "renew_deadline", "retry_period", "seconds"),
        "Failures, timed": (
            "kill_leader_at",
            "stop_leader_at",
            "pause_leader_at",
            "pause_for",
            "cut_off_leader_at",
            "cut_off_for",
            "skew",
        ),
        "Incidents from the field": (
            "no_fencing",
            "work_after_loss",
            "shutdown_for",
            "lease_durations",
            "starve_leader_every",
            "starve_for",
        ),
        "More": ("release_on_cancel", "seed", "replicas_as"),
        "Network": NETWORK_FIELDS,
    }
    actor_label = "replica-{n}"
    actors_param = "replicas"
    state_keys = ("lease", "replicas")
    state_template = "scenarios/leader_election.html"
    state_title = "The Lease, and what each replica believes"
    script = "occviz/scenarios/leader_election.js"
    list_params = ("skew", "lease_durations", "latency_ms")
    kinds = (
        _kind(
            "acquired", "acquired the lease", "#1a9e4b", "star", first=(_FAILOVER, *_OUTSIDE["acquired"]), writes=True
        ),
        _kind("renewed", "renewed", "#7cc89a", "tick", first=_OUTSIDE["renewed"], writes=True),
        _kind("backed_off", "backed off", "#b8c0cc", "tick"),
        _kind(
            "conflict",
            "conflict on the lease",
            "#d62828",
            "cross",
            first=_OUTSIDE["conflict"],
            explain=_LEASE_409,
            refused=True,
        ),
        _kind("renew_failed", "renew failed", "#f08c00", "triangle"),
        _kind("lost", "stepped down", "#7a1010", "square"),
        _kind("released", "released", "#1c64d6", "square", first=_OUTSIDE["released"], writes=True),
        _kind("guarded_write", "guarded write", "#0f766e", "dot", writes=True),
        _kind("fenced", "fenced (stale write rejected)", "#d62828", "dot", refused=True),
        _kind("db_error", "database error", "#9b1c1c", "diamond"),
        _kind("reconnected", "reconnected", "#8a94a6", "dot"),
        _kind("killed", "killed", "#111111", "square"),
        _kind("stopped", "stopped", "#4a5568", "square"),
        _kind("paused", "paused", "#8b3fd9", "triangle"),
        _kind("woke", "woke", "#8b3fd9", "star"),
        _kind("cut_off", "cut off", "#f08c00", "diamond"),
        _kind("skewed", "clock skewed", "#6b7280", "tick"),
        _kind("added", "joined", "#1a9e4b", "dot"),
        _kind("control_failed", "control refused", "#7a1010", "diamond"),
        _kind("starved", "starved of CPU", "#b45309", "triangle"),
        _kind("working_on", "works on without leading", "#c2410c", "diamond"),
        _kind("work_stopped", "work stopped", "#4a5568", "tick"),
        latency_changed_kind("replicas"),
        ERROR,
    )
    figures = (
        Figure("transitions", "lease transitions", from_state=True),
        Figure("leading", "believe they lead", from_state=True),
        Figure("acquisitions", "acquisitions", count=("acquired",)),
        Figure("renewals", "renewals", count=("renewed",)),
        Figure("conflicts", "conflicts", count=("conflict",)),
        Figure("guarded_writes", "guarded writes", count=("guarded_write",)),
        Figure("fenced_writes_rejected", "stale writes fenced", count=("fenced",)),
        Figure("step_downs", "step-downs", count=("lost",)),
        Figure("db_errors", "database errors", count=("db_error",)),
        Figure("renewals_per_s", "renewals/s", per_second=("renewed",), shown=False),
    )
    rates = ("renewed", "conflict", "backed_off")
    controls = (
        Control("kill", "kill", "Stops at once without releasing: failover after the lease expires."),
        Control("stop", "stop", "Stops gracefully; with ReleaseOnCancel it releases: fast handover."),
        Control("pause", "pause", "A stop-the-world pause: it wakes believing it leads.", seconds=(0.1, 86_400)),
        Control(
            "cut_off", "cut off", "Cut off from the database: it steps down after RenewDeadline.", seconds=(0.1, 86_400)
        ),
        Control(
            "skew", "skew clock", "Its wall clock runs ahead: renewTime lies, nobody trusts it.", seconds=(-3600, 3600)
        ),
        Control(
            "starve",
            "starve CPU",
            "Its renewal comes late: past RenewDeadline, it steps down.",
            seconds=(0.1, 86_400),
        ),
        Control("add", "add a replica", "A new replica joins the election.", per_actor=False, adds_actor=True),
        latency_control("replicas"),
    )
    compared = (
        ("replicas", "replicas"),
        ("lease_duration", "lease duration (s)"),
        ("renew_deadline", "renew deadline (s)"),
        ("retry_period", "retry period (s)"),
        ("transitions", "transitions"),
        ("max_leaders_at_once", "most valid leaders at once"),
        ("renewals", "renewals"),
        ("acquire_attempts", "acquire attempts"),
        ("conflicts", "conflicts"),
        ("fenced_writes_rejected", "stale writes fenced"),
        ("fenced_writes_landed", "stale writes landed"),
        ("split_brain_s", "seconds with two leaders"),
        ("non_leader_writes_landed", "writes landed by a non-leader"),
        ("duration_s", "duration (s)"),
        *NETWORK_COMPARED,
    )
    presets = (
        Preset(
            "classroom",
            "Classroom",
            "Three replicas on a 3 s lease (renew deadline 2 s, retry every 0.5 s): transitions you can watch.",
            {"replicas": 3, "lease_duration": 3, "renew_deadline": 2, "retry_period": 0.5, "seconds": 20},
        ),
        Preset(
            "client-go-defaults",
            "client-go defaults",
            "kube-controller-manager's timings: a 15 s lease, renew deadline 10 s, retry every 2 s.",
            {"replicas": 3, "lease_duration": 15, "renew_deadline": 10, "retry_period": 2, "seconds": 20},
        ),
        Preset(
            "kill-the-leader",
            "Kill the leader",
            "The leader dies without releasing: the others wait out the lease, then one takes over.",
            {
                "replicas": 3,
                "lease_duration": 3,
                "renew_deadline": 2,
                "retry_period": 0.5,
                "seconds": 15,
                "kill_leader_at": 4,
            },
        ),
        Preset(
            "graceful-handover",
            "Graceful handover",
            "The leader stops and releases the lease: a follower takes it within a retry period.",
            {
                "replicas": 3,
                "lease_duration": 3,
                "renew_deadline": 2,
                "retry_period": 0.5,
                "seconds": 12,
                "stop_leader_at": 4,
                "release_on_cancel": True,
            },
        ),
        Preset(
            "stale-leader",
            "Stale leader (pause)",
            "The leader freezes for 6 s, longer than its lease: it wakes believing it leads, and its write is fenced.",
            {
                "replicas": 3,
                "lease_duration": 3,
                "renew_deadline": 2,
                "retry_period": 0.5,
                "seconds": 16,
                "pause_leader_at": 4,
                "pause_for": 6,
            },
        ),
        Preset(
            "network-cut",
            "Network cut",
            "The leader loses the database: it steps down after its renew deadline, before anyone else may lead.",
            {
                "replicas": 3,
                "lease_duration": 3,
                "renew_deadline": 2,
                "retry_period": 0.5,
                "seconds": 15,
                "cut_off_leader_at": 4,
                "cut_off_for": 5,
            },
        ),
        Preset(
            "clock-skew",
            "Clock skew",
            "Two replicas' clocks run 30 s ahead and 20 s behind: renewTime lies, nobody trusts it, safety holds.",
            {
                "replicas": 3,
                "lease_duration": 3,
                "renew_deadline": 2,
                "retry_period": 0.5,
                "seconds": 15,
                "skew": "replica-2=30 replica-3=-20",
                "kill_leader_at": 5,
            },
        ),
        Preset(
            "acting-after-loss",
            "Incident: acting after losing the lease",
            "The leader freezes past its lease and steps down when it wakes, but its work loop is bound to the "
            "process, not to its leadership, and writes on for 4 s. Without fencing those writes land next to the "
            "new leader's: split brain.",
            {
                "replicas": 3,
                "lease_duration": 3,
                "renew_deadline": 2,
                "retry_period": 0.5,
                "seconds": 16,
                "pause_leader_at": 4,
                "pause_for": 6,
                "work_after_loss": 4,
                "no_fencing": True,
            },
        ),
        Preset(
            "acting-after-loss-fenced",
            "Incident: acting after losing the lease, fenced",
            "The same leader writes on for 4 s after it stepped down, its work bound to the process. This time its "
            "writes carry its fencing token, and the database rejects every one of them.",
            {
                "replicas": 3,
                "lease_duration": 3,
                "renew_deadline": 2,
                "retry_period": 0.5,
                "seconds": 16,
                "pause_leader_at": 4,
                "pause_for": 6,
                "work_after_loss": 4,
            },
        ),
        Preset(
            "slow-shutdown",
            "Incident: shutdown slower than the lease",
            "The leader is stopped and stops renewing, but draining its work takes 6 s, longer than LeaseDuration "
            "minus RenewDeadline. The next leader starts while the old one is still writing, and releasing at the "
            "end comes too late.",
            {
                "replicas": 3,
                "lease_duration": 3,
                "renew_deadline": 2,
                "retry_period": 0.5,
                "seconds": 14,
                "stop_leader_at": 4,
                "shutdown_for": 6,
                "release_on_cancel": True,
                "no_fencing": True,
            },
        ),
        Preset(
            "mixed-lease-durations",
            "Incident: mixed lease durations",
            "replica-3 joins configured with a 0.5 s LeaseDuration and judges the leader's 4 s lease by its own "
            "setting, not by the Lease's leaseDurationSeconds. It takes over between two renewals, and the old "
            "leader writes on until its RenewDeadline: two leaders.",
            {
                "replicas": 3,
                "lease_duration": 4,
                "renew_deadline": 3,
                "retry_period": 1,
                "seconds": 12,
                "lease_durations": "replica-3=0.5",
                "no_fencing": True,
            },
        ),
        Preset(
            "cpu-starved-leader",
            "Incident: a CPU-starved leader",
            "Every 6 s whoever leads is starved of CPU for 5 s, so its renewal comes after RenewDeadline and it steps "
            "down. Leadership cycles between the replicas, each transition counted.",
            {
                "replicas": 3,
                "lease_duration": 3,
                "renew_deadline": 2,
                "retry_period": 0.5,
                "seconds": 20,
                "starve_leader_every": 6,
                "starve_for": 5,
            },
        ),
    )

    def run(self, context: JobContext) -> dict[str, Any]:
        return job.run(context)

    def read_state(self, job_id: int, params: Mapping[str, Any]) -> State:
        return job.read_state(job_id, params)

    def connections(self, params: Mapping[str, Any]) -> int:
        # One session per replica, and room for the replicas a person adds while it runs.
        return int(params["replicas"]) + ADDED_REPLICAS

    def control_seconds(self, action: str, params: Mapping[str, Any]) -> float | None:
        lease_s = float(params.get("lease_duration") or 15)
        renew_s = float(params.get("renew_deadline") or 10)
        return {"pause": 2 * lease_s, "cut_off": lease_s, "skew": 30.0, "starve": lease_s + renew_s}.get(action)

    def setup(self, params: Mapping[str, Any]) -> str:
        line = (
            f"{params.get('replicas')} replicas, lease {params.get('lease_duration'):g} s / renew deadline "
            f"{params.get('renew_deadline'):g} s / retry {params.get('retry_period'):g} s, {params.get('seconds'):g} s"
        )
        timed = [
            f"{words} at {params[name]:g} s"
            for name, words in (
                ("kill_leader_at", "kill"),
                ("stop_leader_at", "stop"),
                ("pause_leader_at", "pause"),
                ("cut_off_leader_at", "cut-off"),
            )
            if params.get(name) is not None
        ]
        if params.get("skew"):
            timed.append(f"skew {params['skew']}")
        timed += [
            words.format(value=params[name])
            for name, words in (
                ("work_after_loss", "works {value:g} s after losing the lease"),
                ("shutdown_for", "shutdown takes {value:g} s"),
                ("lease_durations", "own lease durations {value}"),
                ("starve_leader_every", "leader starved every {value:g} s"),
            )
            if params.get(name)
        ]
        if params.get("no_fencing"):
            timed.append("no fencing")
        if params.get("replicas_as") == "threads":
            timed.append("replicas as threads")
        return line + network_setup(params) + (f"; {', '.join(timed)}" if timed else "")


scenario = LeaderElectionScenario()
