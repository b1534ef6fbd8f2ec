"""What a sweep measures: its levels of concurrency, its series (strategies, then pgbench), and how each is drawn.

Shared by the form (to bound the sweep's length), the job (to run it) and its state (to
draw it): one place says which points a sweep has and in what order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from occviz.scenarios.counter.actors import STRATEGIES

PGBENCH = "pgbench"
DEFAULT_STRATEGIES = "occ atomic"

# Each series' colour and dash: told apart by more than colour (pgbench, the yardstick, dashed).
SERIES_STYLE: dict[str, tuple[str, list[int]]] = {
    "none": ("#7a1010", [2, 3]),
    "occ": ("#1c64d6", []),
    "pessimistic": ("#8b3fd9", [8, 3, 2, 3]),
    "serializable": ("#b45309", [10, 4]),
    "atomic": ("#1a9e4b", []),
    PGBENCH: ("#4a5568", [6, 4]),
}
assert set(SERIES_STYLE) == {*STRATEGIES, PGBENCH}


def levels(max_writers: int) -> list[int]:
    """1, 2, 4, ... up to `max_writers`, which ends the list even when it is no power of two."""
    found = []
    writers = 1
    while writers <= max_writers:
        found.append(writers)
        writers *= 2
    if found[-1] != max_writers:
        found.append(max_writers)
    return found


def strategies_of(params: Mapping[str, Any]) -> list[str]:
    """The strategies a (cleaned) sweep compares, in the order given."""
    return str(params.get("strategies") or DEFAULT_STRATEGIES).split()


def series_of(params: Mapping[str, Any]) -> list[str]:
    """The lines of the curve: each strategy, then pgbench unless it is off."""
    return [*strategies_of(params), *([PGBENCH] if params.get("pgbench", "on") != "off" else [])]


LATENCY = "latency"
"""The axis that holds the writers fixed and moves their one-way network latency (`axis`)."""


def latency_levels(max_latency_ms: float) -> list[float]:
    """0 (a direct connection), then an eighth, a quarter, a half and the whole of `max_latency_ms`."""
    return [0.0, *(round(max_latency_ms / 2**k, 3) for k in (3, 2, 1, 0))]


def over_latency(params: Mapping[str, Any]) -> bool:
    return params.get("axis") == LATENCY


def levels_of(params: Mapping[str, Any]) -> list[Any]:
    """The x-axis's levels: writers (1, 2, 4, ...), or latencies in ms at max_writers writers."""
    if over_latency(params):
        return latency_levels(float(params.get("max_latency_ms") or 0.0))
    return levels(int(params.get("max_writers") or 1))


def level_key(params: Mapping[str, Any]) -> str:
    """The key of a point (and of a row of the table) that places it on the x-axis."""
    return "latency_ms" if over_latency(params) else "writers"


def axis_of(params: Mapping[str, Any]) -> dict[str, Any]:
    """How the curve's x-axis is drawn: the points' key, its words, and whether on a log2 scale."""
    if over_latency(params):
        writers = int(params.get("max_writers") or 1)
        return {
            "key": "latency_ms",
            "label": f"one-way latency (ms), {writers} writer{'s' * (writers != 1)} (pgbench: clients)",
            "heading": "latency (ms)",
            "log": False,
        }
    return {"key": "writers", "label": "writers (pgbench: clients), log scale", "heading": "writers", "log": True}


def series_style(name: str) -> dict[str, Any]:
    color, dash = SERIES_STYLE[name]
    return {"name": name, "color": color, "dash": dash}
