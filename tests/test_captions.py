"""Captions: every scenario's captioned kinds read whole for the events its jobs really record; bad ones are refused.

A caption says what just happened and its Kubernetes counterpart (EventKind.captions). The
browser fills the same templates with the same rules (viz.js `Vocabulary.fill`); here each
short job's stored events are captioned in Python, as replay and the page read them.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import pytest
from django.db import connection

from occviz.jobs.models import Event, Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.scenarios import SCENARIOS
from occviz.scenarios.base import ERROR, EventKind
from occviz.store import writes
from occviz.store.cas import ANY
from occviz.store.models import Counter
from tests.test_outside_writes import OutsideIncrementer

pytestmark = pytest.mark.django_db(transaction=True)

_LEADER = {"replicas": 3, "lease_duration": 1, "renew_deadline": 0.6, "retry_period": 0.2}

# Short jobs that between them record every kind a class meets in each scenario, key moments included.
JOBS: list[tuple[str, dict[str, Any], set[str]]] = [
    ("counter", {"strategy": "occ", "writers": 6, "increments": 15, "think_ms": 2}, {"conflict", "retry"}),
    ("counter", {"strategy": "occ", "writers": 6, "increments": 15, "think_ms": 2, "max_attempts": 1}, {"gave_up"}),
    ("counter", {"strategy": "none", "writers": 6, "increments": 15, "think_ms": 2}, {"committed"}),
    # Think time between the shared lock and the update: both writers hold the row FOR SHARE by then, even on a busy
    # machine where one writer could otherwise read and write before the other reads (no deadlock to see).
    (
        "counter",
        {"strategy": "pessimistic", "lock": "share", "writers": 2, "increments": 3, "think_ms": 50},
        {"deadlock"},
    ),
    ("counter", {"strategy": "serializable", "writers": 4, "increments": 10, "think_ms": 1}, {"serialization_failure"}),
    ("counter", {"strategy": "atomic", "writers": 2, "increments": 5}, {"committed"}),
    (
        "leader-election",
        {**_LEADER, "seconds": 4, "kill_leader_at": 0.8, "stop_leader_at": 2.6, "release_on_cancel": True},
        {"acquired", "renewed", "backed_off", "killed", "stopped", "released"},
    ),
    (
        "leader-election",
        {**_LEADER, "seconds": 4, "pause_leader_at": 0.6, "pause_for": 1.6},
        {"paused", "woke", "fenced", "acquired"},
    ),
    (
        "quota",
        {
            "pods": 24,
            "hard": 16,
            "workers": 4,
            "think_ms": 2,
            "create_failure_rate": 0.3,
            "resync_seconds": 1,
            "seed": 3,
        },
        {"admitted", "conflict", "denied", "create_failed", "resync"},
    ),
    ("controllers", {"strategy": "none", "rate_per_s": 50, "seconds": 1.5}, {"erased", "committed"}),
    ("controllers", {"strategy": "occ", "rate_per_s": 50, "seconds": 1.5}, {"conflict", "retry"}),
]


def stored_events(job_id: int) -> list[dict[str, Any]]:
    """The job's events as replay reads them (detail as JSON text), turned into the dicts a caption fills."""
    rows = Event.objects.filter(job_id=job_id).order_by("seq").values()
    return [
        {**row, "detail": json.loads(row["detail"]) if isinstance(row["detail"], str) else row["detail"]}
        for row in rows
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scenario", "params", "expected"), JOBS, ids=[f"{s}-{'-'.join(sorted(e))}" for s, _, e in JOBS]
)
def test_every_recorded_event_of_a_captioned_kind_reads_whole(
    scenario: str, params: dict[str, Any], expected: set[str]
) -> None:
    spec = SCENARIOS[scenario]
    job = run_job(create_job(scenario, params).pk)
    assert job.status == "succeeded", job.error
    events = stored_events(job.pk)
    captioned = {kind.name for kind in spec.kinds if kind.captions}
    seen: set[str] = set()
    for event in events:
        caption = spec.caption(event)
        if event["kind"] not in captioned:
            assert caption is None
            continue
        seen.add(event["kind"])
        assert caption, f"no caption template filled for {event}"
        assert not re.search(r"[{}]", caption), caption
        assert "None" not in caption, caption
    missing = expected - seen
    assert not missing, f"the job recorded no {', '.join(sorted(missing))}: the check saw too little"


def test_outside_writes_are_captioned_whole(alice: Any) -> None:
    """Outside writes (the API, the admin) into a running race: conditional ones, their 409s, a blind one."""
    # More increments than it can make before the outside writes end, however busy the machine: cancelled after them.
    job = create_job("counter", {"strategy": "occ", "writers": 2, "increments": 10_000, "think_ms": 3}, alice)
    outside = OutsideIncrementer(job.pk, increments=15, think_s=0.004)

    def then_blind() -> None:
        outside.join(timeout=60)
        try:
            row = Counter.objects.get(job_id=job.pk)
            writes.update(row, {"value": 1}, writes.Writer("admin", "bob"), expected_version=ANY)
            Job.objects.get(pk=job.pk).request_cancel()
        finally:
            connection.close()

    blind = threading.Thread(target=then_blind)
    outside.start()
    blind.start()
    run_job(job.pk)
    blind.join(timeout=60)
    assert outside.error is None, outside.error
    spec = SCENARIOS["counter"]
    said = {
        event["kind"]: spec.caption(event) for event in stored_events(job.pk) if event["kind"].startswith("outside")
    }
    assert set(said) == {"outside_write", "outside_conflict"}, "no outside conflict or write: raise the think time"
    assert all(text and "{" not in text for text in said.values()), said
    erasing = [
        spec.caption(event) for event in stored_events(job.pk) if (event["detail"] or {}).get("blind") == "blind"
    ]
    assert len(erasing) == 1 and erasing[0].startswith(
        "bob wrote the counter via the admin without a resourceVersion, erasing"
    )  # type: ignore[union-attr]


def test_a_failover_is_captioned_with_its_wait_and_kubernetes_counterpart() -> None:
    spec = SCENARIOS["leader-election"]
    event = {
        "kind": "acquired",
        "actor": 2,
        "value_written": 3,
        "detail": {"holder": "replica-1", "after_s": 3.4, "after": "replica-1 was killed"},
    }
    assert spec.caption(event) == (
        "replica-2 waited out replica-1's lease and took it (transition 3), 3.4 s after replica-1 was killed: "
        "timed by its own clock since it last saw the Lease change, never by the holder's renewTime."
    )
    assert spec.kind("acquired").key  # type: ignore[union-attr]


def test_the_vocabulary_sends_captions_key_moments_and_plurals() -> None:
    kinds = {kind["name"]: kind for kind in SCENARIOS["counter"].vocabulary({"writers": 2})["kinds"]}
    assert kinds["conflict"]["captions"][0].startswith("{who}'s update matched no row")
    assert kinds["conflict"]["plural"] == "conflicts" and kinds["conflict"]["key"] is False
    assert kinds["read"]["captions"] == []
    assert kinds["error"]["key"] is True


def test_every_scenario_has_key_moments_and_counts_its_captioned_kinds() -> None:
    for name in ("counter", "leader-election", "quota", "controllers"):
        kinds = SCENARIOS[name].kinds
        assert any(kind.key for kind in kinds), name
        assert all(kind.plural for kind in kinds if kind.captions), name
    assert ERROR.captions and ERROR.key


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"captions": ("{who} read {versoin_read}",)}, "unknown placeholder {versoin_read}"),
        ({"sentences": ("{whom} read",)}, "unknown placeholder {whom}"),
        ({"captions": ("{who} read {detail.}",)}, "unknown placeholder {detail.}"),
        ({"captions": ("{who} read {value_read:kb}",)}, "a brace that is no placeholder"),
        ({"captions": ("{who} read }",)}, "a brace that is no placeholder"),
        ({"captions": ("{who} read",), "plural": ""}, "needs a plural noun"),
        ({"key": True, "captions": ()}, "a key moment needs a caption"),
        ({"captions": ("  ",)}, "an empty caption"),
    ],
)
def test_a_bad_caption_declaration_is_refused_with_why(options: dict[str, Any], says: str) -> None:
    declared = {"sentences": ("{who} read",), "captions": (), "plural": "reads"} | options
    with pytest.raises(ValueError, match=re.escape(says)):
        EventKind("read", "read", declared.pop("sentences"), "#000000", **declared)
