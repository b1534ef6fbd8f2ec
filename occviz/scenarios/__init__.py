"""The scenarios a job can run: each module here that defines `scenario` is one (see base.py).

They are found when the app loads (`ScenariosConfig.ready`), registered here for the
pages and the live stream, and with the job runner as programs it can run.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from occviz.jobs.registry import register_program, unregister_program

if TYPE_CHECKING:
    from occviz.scenarios.base import Scenario

SCENARIOS: dict[str, Scenario] = {}

_NOT_SCENARIOS = {"base", "apps"}


def register(scenario: Scenario) -> None:
    SCENARIOS[scenario.name] = scenario
    register_program(scenario)


def unregister(name: str) -> None:
    SCENARIOS.pop(name, None)
    unregister_program(name)


def discover() -> None:
    """Import every scenario module of this package and register what it declares."""
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name in _NOT_SCENARIOS:
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        declared = getattr(module, "scenario", None)
        if declared is not None:
            register(declared)
