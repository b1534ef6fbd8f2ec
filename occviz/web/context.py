"""Template context every dashboard page has: the scenarios, for the navigation."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from occviz.scenarios import SCENARIOS


def scenarios(request: HttpRequest) -> dict[str, Any]:
    return {"nav_scenarios": list(SCENARIOS.values())}
