"""Admin for lessons: a lesson with its steps inline, reordered by their order field.

A step is saved only if the scenario's own parameters form takes it (`Step.clean`): the error
names the parameter and says why, and nothing of the lesson is saved.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import Count, QuerySet
from django.http import HttpRequest

from occviz.lessons.models import Lesson, LessonRun, LessonRunJob, Step
from occviz.scenarios import SCENARIOS


def _scenario_choices() -> list[tuple[str, str]]:
    return [(name, spec.title) for name, spec in SCENARIOS.items()]


def _presets_help() -> str:
    return "; ".join(f"{spec.title}: {', '.join(p.slug for p in spec.presets)}" for spec in SCENARIOS.values())


class StepForm(forms.ModelForm):
    # A choice among the scenarios installed now, read when the form is built.
    scenario = forms.ChoiceField(choices=_scenario_choices)

    class Meta:
        model = Step
        fields = ["order", "title", "scenario", "preset", "params", "say", "ask", "point_at"]
        widgets = {
            "say": forms.Textarea(attrs={"rows": 3, "cols": 60}),
            "ask": forms.Textarea(attrs={"rows": 2, "cols": 60}),
            "point_at": forms.Textarea(attrs={"rows": 3, "cols": 60}),
            "params": forms.Textarea(attrs={"rows": 2, "cols": 60}),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["preset"].help_text = f"Blank, or one of the scenario's presets ({_presets_help()})."


class StepInline(admin.StackedInline):
    model = Step
    form = StepForm
    extra = 0
    ordering = ["order", "id"]


@admin.register(Lesson)
class LessonAdmin(admin.ModelAdmin):
    list_display = ["title", "slug", "steps_count", "minutes", "position"]
    list_editable = ["position"]
    prepopulated_fields = {"slug": ["title"]}
    inlines = [StepInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Lesson]:
        return super().get_queryset(request).annotate(step_count=Count("steps"))

    @admin.display(description="steps", ordering="step_count")
    def steps_count(self, lesson: Any) -> int:
        return int(lesson.step_count)


class LessonRunJobInline(admin.TabularInline):
    model = LessonRunJob
    extra = 0
    fields = readonly_fields = ("step", "job", "created_at")

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # a run's jobs are launched from the lesson pages


@admin.register(LessonRun)
class LessonRunAdmin(admin.ModelAdmin):
    list_display = ["id", "lesson", "started_by", "started_at"]
    list_filter = ["lesson"]
    readonly_fields = ["lesson", "started_by", "started_at"]
    inlines = [LessonRunJobInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
