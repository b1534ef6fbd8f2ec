"""The scenarios a job can run, by name. Each module: name, title, summary, form_class, run()."""

from __future__ import annotations

from typing import TYPE_CHECKING

from occviz.scenarios import counter

if TYPE_CHECKING:
    from occviz.scenarios.base import Scenario

SCENARIOS: dict[str, Scenario] = {counter.name: counter}
