"""Writes from outside a job (the admin, the HTTP API), as events of the job on lanes of their own.

`occviz.store.writes` hands each write to a running job's objects, or each refusal, to
the job (`JobContext.on_outside_write`) as a payload. A scenario turns it into events of
its own kinds; what every scenario needs for that is here: the writer's lane (numbered
the first time it writes, named after it: "api: alice (token laptop)"), the detail
every outside event carries (the lane's name, so pages, replay and exports word it
without asking the job), and the moment of the write by the server's clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from django.utils import timezone

from occviz.scenarios.base import EventKind
from occviz.store.models import Change

if TYPE_CHECKING:
    from occviz.jobs.context import JobContext

Payload = Mapping[str, Any]

# How a sentence says where the write came from: "alice (token laptop) via the API".
VIA_WORDS: Final = {"api": "the API", "admin": "the admin", "job": "another job", "student": "a student link"}


def lane_name(payload: Payload) -> str:
    """The lane of the writer of `payload`: "api: alice (token laptop)", "admin: bob"."""
    return f"{payload.get('via') or 'outside'}: {payload.get('writer') or 'unknown'}"


@dataclass(frozen=True)
class OutsideWrite:
    """One outside write as a scenario records it: its lane and the detail its events carry."""

    actor: int
    detail: dict[str, Any]
    payload: Payload

    @property
    def type(self) -> str:
        return str(self.payload.get("type") or "")

    @property
    def before(self) -> Mapping[str, Any]:
        return self.payload.get("before") or {}

    @property
    def after(self) -> Mapping[str, Any]:
        return self.payload.get("after") or {}

    @property
    def blind(self) -> bool:
        return self.payload.get("expected_version") is None

    @property
    def plus_one(self) -> bool:
        """A student's press: always the value it read plus one (occviz/students/presses.py)."""
        return self.payload.get("via") == "student"

    @property
    def version_written(self) -> int | None:
        version = self.payload.get("resource_version")
        return None if version is None else int(version)

    @property
    def version_read(self) -> int | None:
        """The version the writer had read: the one it expected, or (blind) the one stored before its write."""
        expected = self.payload.get("expected_version")
        if expected is not None:
            return int(expected)
        written = self.version_written
        if written is None:
            return None
        return written - 1 if self.type == "MODIFIED" else written


def outside_write(context: JobContext, payload: Payload, lane: str | None = None) -> OutsideWrite:
    """The write's lane (by default named after its writer) and the detail every outside event carries.

    detail: lane (the lane's name: how pages and exports name the actor), writer, via, via_words,
    change (the Change's id, which the watch page shows), blind ("blind" for an unconditional
    write), stored_version (for a refusal: the version stored when it was refused).
    """
    name = lane or lane_name(payload)
    detail: dict[str, Any] = {
        "lane": name,
        "writer": payload.get("writer"),
        "via": payload.get("via"),
        "via_words": VIA_WORDS.get(str(payload.get("via")), str(payload.get("via"))),
        "change": payload.get("change"),
    }
    if payload.get("expected_version") is None and payload.get("type") in ("MODIFIED", "DELETED"):
        detail["blind"] = "blind"
    if payload.get("type") == "CONFLICT":
        detail["stored_version"] = payload.get("resource_version")
    return OutsideWrite(context.outside_lane(name), detail, payload)


def written_at(payload: Payload) -> str:
    """When the write was stored, by the server's clock (its Change's time), as ISO text."""
    at = Change.objects.filter(pk=int(payload.get("change") or 0)).values_list("at", flat=True).first()
    return (at or timezone.now()).isoformat()  # a Change pruned already: it was stored just now


def outside_conflict_kind(explain: str) -> EventKind:
    """An outside writer's 409: it had read a version that was no longer the stored one."""
    return EventKind(
        "outside_conflict",
        "outside conflict (409)",
        ("{detail.writer} via {detail.via_words}: conflict, had v{version_read}, stored v{detail.stored_version}",),
        "#d62828",
        "cross",
        explain=explain,
        captions=(
            "{detail.writer} via {detail.via_words} got 409 Conflict: it had read v{version_read}, the store "
            "holds v{detail.stored_version}. It is what `kubectl apply` prints when the object changed under it.",
        ),
        key=True,
        plural="outside conflicts",
        singular="outside conflict",
    )


def outside_deleted_kind(what: str, label: str = "deleted from outside") -> EventKind:
    """One of the job's objects deleted from outside: `what` names it in the sentence ("the quota")."""
    return EventKind(
        "outside_deleted",
        label,
        (f"{{detail.writer}} via {{detail.via_words}}: deleted {what} at v{{version_read}}",),
        "#7a1010",
        "square",
        captions=(
            f"{{detail.writer}} via {{detail.via_words}} deleted {what} at v{{version_read}} (a `kubectl delete`): "
            "the job's writers find nothing left to update.",
        ),
        key=True,
        plural="deletions",
        singular="deletion",
    )
