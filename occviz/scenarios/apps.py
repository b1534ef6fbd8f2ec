"""The scenarios app: registers every scenario module when Django starts."""

from __future__ import annotations

from django.apps import AppConfig


class ScenariosConfig(AppConfig):
    name = "occviz.scenarios"
    label = "scenarios"
    verbose_name = "Scenarios"

    def ready(self) -> None:
        from occviz.scenarios import discover

        discover()
