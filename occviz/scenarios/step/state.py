"""What a step-mode job shows and reports, folded from its events alone: its state at any event, and its summary.

Every event of a step job carries the rows as committed after it, the rows as each actor
sees them and each actor's status (occviz.steps.engine's Outcome). Folding the events in
order gives the script with each step's outcome so far, the lost updates, and the summary
`runjob step --json` prints: replay and export show what the live page showed.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from occviz.steps.script import Script

STEP_KINDS = (
    "begin",
    "read",
    "write",
    "insert",
    "delete",
    "conflict",
    "blocked",
    "resumed",
    "commit",
    "abort",
    "serialization_failure",
    "deadlock",
    "lock_timeout",
    "step_error",
)
"""The kinds an outcome of a step is recorded as."""
FAILURES = ("serialization_failure", "deadlock", "lock_timeout", "step_error")


def _detail(event: Mapping[str, Any]) -> dict[str, Any]:
    detail = event.get("detail")
    if isinstance(detail, str):
        detail = json.loads(detail or "null")
    return dict(detail or {})


@dataclass
class _Transaction:
    reads: dict[int, int] = field(default_factory=dict)
    """Row id -> the value this transaction read."""
    writes: dict[int, int | None] = field(default_factory=dict)
    """Row id -> the value it read before writing the row (None: not read first)."""


@dataclass
class StepFold:
    """A step job's events folded in order."""

    script: Script
    question: str | None = None
    committed: list[dict[str, int]] = field(default_factory=list)
    seen: dict[str, list[dict[str, int]]] = field(default_factory=dict)
    actors: dict[str, dict[str, Any]] = field(default_factory=dict)
    outcomes: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Step position -> its outcome so far."""
    order: list[int] = field(default_factory=list)
    """Step positions in the order they were taken."""
    kinds: Counter[str] = field(default_factory=Counter)
    lost: Counter[tuple[int, int]] = field(default_factory=Counter)
    """(row, value read) -> committed transactions that wrote that row after reading that value."""
    transactions: dict[str, _Transaction] = field(default_factory=dict)
    ended: dict[str, list[str]] = field(default_factory=dict)
    """Actor -> how each of its transactions ended ("committed", "aborted", "failed with 40001")."""
    waits: list[str] = field(default_factory=list)

    def add(self, event: Mapping[str, Any]) -> None:
        kind = event["kind"]
        detail = _detail(event)
        if "committed" in detail:
            self.committed = detail["committed"]
        if "seen" in detail:
            self.seen = detail["seen"]
        if "actors" in detail:
            self.actors = detail["actors"]
        if kind not in STEP_KINDS:
            return
        self.kinds[kind] += 1
        position = int(event["op"]) - 1
        actor = self.script.steps[position].actor
        found = self.outcomes.get(position)
        if found is None:
            self.order.append(position)
            found = self.outcomes[position] = {}
        if kind == "blocked":
            found.update(outcome="blocked", blocked_by=detail.get("waits_for") or [])
            return
        failed = kind in FAILURES
        if found.get("outcome") == "blocked":
            found["then"] = "error" if failed else "ok"
            if detail.get("duration_ms") is not None:
                found["waited_ms"] = detail["duration_ms"]
            self.waits.append(f"{actor} waited for {' and '.join(found['blocked_by']) or 'a lock'}")
        else:
            found["outcome"] = "error" if failed else "ok"
        found.update(
            kind=kind,
            sqlstate=detail.get("sqlstate"),
            message=detail.get("message"),
            rows=detail.get("rows"),
            count=detail.get("count"),
        )
        self._follow(actor, kind, detail)

    def _follow(self, actor: str, kind: str, detail: Mapping[str, Any]) -> None:
        """Each actor's transaction: what it read, what it wrote after reading, how it ended."""
        if detail.get("began"):
            self.transactions[actor] = _Transaction()
        transaction = self.transactions.setdefault(actor, _Transaction())
        rows = detail.get("rows") or []
        step_kind = detail.get("step_kind")
        if kind in FAILURES:
            if detail.get("status") == "idle" or detail.get("sqlstate") in ("40001", "40P01"):
                self._end(actor, f"failed with {detail.get('sqlstate')}")
            return
        if step_kind in ("read", "predicate read", "locking read"):
            for row in rows:
                transaction.reads.setdefault(row["id"], row["value"])
        elif kind in ("write", "resumed") and step_kind in ("write", "compare-and-swap"):
            for row in rows:
                transaction.writes.setdefault(row["id"], transaction.reads.get(row["id"]))
        elif kind == "commit":
            for row_id, value_read in transaction.writes.items():
                if value_read is not None:
                    self.lost[(row_id, value_read)] += 1
            self._end(actor, "committed")
        elif kind == "abort":
            self._end(actor, "rolled back" if detail.get("rolled_back") else "aborted")

    def _end(self, actor: str, how: str) -> None:
        self.transactions.pop(actor, None)
        self.ended.setdefault(actor, []).append(how)

    @property
    def lost_updates(self) -> int:
        """Committed read-modify-writes of a row from the same value read: all but one of each such group lost."""
        return sum(count - 1 for count in self.lost.values() if count > 1)

    # -- what is shown ---------------------------------------------------------------

    def step_json(self, position: int) -> dict[str, Any]:
        step = self.script.steps[position]
        found = self.outcomes.get(position, {})
        return {
            "position": position,
            "line": step.line,
            "actor": step.actor,
            "step": step.text,
            "kind": step.kind.value,
            "outcome": found.get("outcome"),
            "then": found.get("then"),
            "blocked_by": found.get("blocked_by", []),
            "sqlstate": found.get("sqlstate"),
            "message": found.get("message"),
            "rows": found.get("rows"),
            "conflict": found.get("kind") == "conflict",
        }

    def state(self) -> dict[str, Any]:
        """The job page's state: the rows now, each actor, the script with its outcomes so far, the question."""
        actors = []
        for name in self.script.actors:
            view = self.actors.get(name, {})
            position = view.get("next_step", self.script.steps.index(self.script.steps_of[name][0]))
            next_step = None
            if position is not None:
                step = self.script.steps[position]
                next_step = {"text": step.text, "line": step.line, "position": position}
            status = view.get("status", "idle")
            actors.append(
                {
                    "name": name,
                    "number": self.script.actors.index(name) + 1,
                    "next_step": next_step,
                    "can_step": next_step is not None and status != "blocked",
                    "status": status,
                    "waits_for": view.get("waits_for", []),
                    "seen": self.seen.get(name, []),
                    "isolation": view.get("isolation"),
                }
            )
        return {
            "rows": self.committed,
            "actors": actors,
            "script": [self.step_json(position) for position in range(len(self.script.steps))],
            "question": self.question,
        }

    def steps(self) -> list[dict[str, Any]]:
        """The steps taken, in the order they were taken, as the summary lists them."""
        taken = []
        for position in self.order:
            step = self.script.steps[position]
            found = self.outcomes[position]
            entry: dict[str, Any] = {
                "actor": step.actor,
                "step": step.text,
                "line": step.line,
                "kind": step.kind.value,
                "outcome": found.get("outcome"),
                "sqlstate": found.get("sqlstate"),
                "message": found.get("message"),
                "rows": found.get("rows"),
                "blocked_by": found.get("blocked_by", []),
            }
            if found.get("outcome") == "blocked":
                entry["then"] = found.get("then")
            if found.get("kind") == "conflict":
                entry["conflict"] = True
            taken.append(entry)
        return taken


def fold(script: Script, events: Iterable[Mapping[str, Any]], question: str | None = None) -> StepFold:
    folded = StepFold(script, question)
    for event in events:
        folded.add(event)
    return folded
