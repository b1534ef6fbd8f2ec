from __future__ import annotations

from django.apps import AppConfig


class StudentsConfig(AppConfig):
    name = "occviz.students"
    label = "students"
    verbose_name = "Student links"
