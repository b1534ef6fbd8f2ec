"""Launch-form presets: named starting points a teacher can click, each a valid set of parameters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Preset:
    slug: str
    title: str
    teaches: str
    params: dict[str, Any] = field(default_factory=dict)


COUNTER_PRESETS: tuple[Preset, ...] = (
    Preset(
        "lost-update-demo",
        "Lost update demo",
        "Blind writes with think time: updates vanish, and the job counts them.",
        {"strategy": "none", "writers": 8, "increments": 50, "think_ms": 5},
    ),
    Preset(
        "k8s-default-backoff",
        "k8s default backoff",
        "Compare-and-swap retried with client-go's DefaultBackoff (10, 50, 250 ms; 4 steps).",
        {"strategy": "occ", "retry": "k8s-default-backoff", "writers": 8, "increments": 50, "think_ms": 2},
    ),
    Preset(
        "k8s-default-retry",
        "k8s default retry",
        "Compare-and-swap retried with client-go's DefaultRetry (10 ms, 5 steps): watch the give-ups.",
        {"strategy": "occ", "retry": "k8s-default-retry", "writers": 8, "increments": 50, "think_ms": 2},
    ),
    Preset(
        "pessimistic-lock-queue",
        "Pessimistic lock queue",
        "SELECT ... FOR UPDATE: no conflicts, writers queue on the row lock instead.",
        {"strategy": "pessimistic", "lock": "update", "writers": 8, "increments": 50, "think_ms": 2},
    ),
    Preset(
        "serializable-retries",
        "Serializable retries",
        "SERIALIZABLE transactions: PostgreSQL refuses the losers with SQLSTATE 40001, they retry.",
        {
            "strategy": "serializable",
            "isolation": "serializable",
            "retry": "k8s-default-retry",
            "max_attempts": 20,
            "writers": 8,
            "increments": 50,
            "think_ms": 2,
        },
    ),
    Preset(
        "atomic-increment",
        "Atomic increment",
        "UPDATE ... SET value = value + 1: no read-modify-write, nothing to conflict on.",
        {"strategy": "atomic", "writers": 8, "increments": 200},
    ),
)

PRESETS_BY_SCENARIO: dict[str, tuple[Preset, ...]] = {"counter": COUNTER_PRESETS}


def find_preset(scenario: str, slug: str) -> Preset | None:
    return next((p for p in PRESETS_BY_SCENARIO.get(scenario, ()) if p.slug == slug), None)
