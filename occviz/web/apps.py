from __future__ import annotations

from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "occviz.web"
    label = "web"
    verbose_name = "occviz dashboard"
