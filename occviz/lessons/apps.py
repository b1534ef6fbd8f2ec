from __future__ import annotations

from django.apps import AppConfig


class LessonsConfig(AppConfig):
    name = "occviz.lessons"
    label = "lessons"
    verbose_name = "Lessons"
