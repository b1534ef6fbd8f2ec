"""Events as the sentences a person reads in the job page's log ("writer 5 committed v42")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def _ms(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def describe(event: dict[str, Any]) -> str:
    """One readable line for one event."""
    who = f"writer {event['actor']}"
    kind = event["kind"]
    detail = event.get("detail") or {}
    if kind == "read":
        return f"{who} read v{event['version_read']} (value {event['value_read']})"
    if kind == "committed":
        if event["value_read"] is None:  # atomic: no read, one UPDATE ... SET value = value + 1
            return f"{who} incremented in place: committed v{event['version_written']}"
        line = f"{who} committed v{event['version_written']}"
        if detail.get("overwrote"):
            line += f", blindly overwriting {detail['overwrote']} update(s): lost"
        return line
    if kind == "conflict":
        return f"{who}'s write matched 0 rows: conflict (it read v{event['version_read']})"
    if kind == "retry":
        attempt = detail.get("next_attempt", event["attempt"] + 1)
        return f"{who} retries: attempt {attempt} in {_ms(event['duration_ms'])} ms"
    if kind == "gave_up":
        return f"{who} gave up after {detail.get('attempts', event['attempt'])} attempts"
    if kind == "lock_wait":
        lock = str(detail.get("lock", "the lock"))
        return f"{who} waited {_ms(event['duration_ms'])} ms for {lock}"
    if kind == "serialization_failure":
        return f"{who}'s transaction could not serialize access (40001)"
    if kind == "deadlock":
        return f"{who} was chosen as a deadlock victim"
    if kind == "lock_timeout":
        return f"{who} timed out waiting for the lock"
    if kind == "error":
        return f"{who} failed: {detail.get('message', 'error')}"
    return f"{who}: {kind}"


def log_lines(events: Iterable[dict[str, Any]]) -> list[tuple[int, str, str]]:
    """(seq, kind, line) for each event; a conflict and the retry that follows it read as one line."""
    lines: list[tuple[int, str, str]] = []
    open_conflict: dict[tuple[int, int], int] = {}  # (actor, op) -> index of its conflict line
    for event in events:
        key = (event["actor"], event["op"])
        if event["kind"] == "retry" and key in open_conflict:
            index = open_conflict.pop(key)
            seq, kind, line = lines[index]
            detail = event.get("detail") or {}
            attempt = detail.get("next_attempt", event["attempt"] + 1)
            lines[index] = (seq, kind, f"{line}, retry {attempt} in {_ms(event['duration_ms'])} ms")
            continue
        if event["kind"] == "conflict":
            open_conflict[key] = len(lines)
        else:
            open_conflict.pop(key, None)
        lines.append((event["seq"], event["kind"], describe(event)))
    return lines
