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


def levels_of(params: Mapping[str, Any]) -> list[int]:
    return levels(int(params.get("max_writers") or 1))


def series_style(name: str) -> dict[str, Any]:
    color, dash = SERIES_STYLE[name]
    return {"name": name, "color": color, "dash": dash}
