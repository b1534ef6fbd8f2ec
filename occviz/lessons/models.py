"""Lessons: ordered steps a teacher walks a class through, each a job to launch, and the runs that keep those jobs.

A step names its scenario and, usually, one of the scenario's presets, with parameters of its own
over the preset's: a lesson follows a preset as the scenario's author tunes it. Whatever the step
asks for is checked by the scenario's own validation (its parameters form), in the admin and
again at launch, so a step can only launch what the launch form would.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.urls import reverse
from django.utils import timezone

from occviz.jobs.models import Job
from occviz.jobs.registry import ParamsError
from occviz.scenarios import SCENARIOS
from occviz.scenarios.base import Preset, Scenario


class Lesson(models.Model):
    slug = models.SlugField(unique=True)
    title = models.CharField(max_length=120)
    summary = models.TextField(blank=True, help_text="What the class leaves knowing, in a sentence or two.")
    minutes = models.PositiveSmallIntegerField(default=10, help_text="How long it takes in class.")
    position = models.PositiveSmallIntegerField(default=0, help_text="Its place in the list of lessons, lowest first.")

    class Meta:
        ordering = ["position", "title"]

    def __str__(self) -> str:
        return self.title

    def get_absolute_url(self) -> str:
        return reverse("lessons:detail", args=[self.slug])

    def ordered_steps(self) -> list[Step]:
        """Its steps in the order they are taught: step n of the pages is the n-th of these."""
        return list(self.steps.all())


class Step(models.Model):
    lesson = models.ForeignKey(Lesson, on_delete=models.CASCADE, related_name="steps")
    order = models.PositiveIntegerField(default=0, help_text="Steps are taught from the lowest order up.")
    title = models.CharField(max_length=120)
    scenario = models.CharField(max_length=32)
    preset = models.CharField(
        max_length=64, blank=True, help_text="One of the scenario's presets, or blank: the form's defaults."
    )
    params = models.JSONField(
        "parameters",
        default=dict,
        blank=True,
        help_text='Parameters over the preset\'s, as a JSON object: {"writers": 16}.',
    )
    say = models.TextField("what to say", help_text="Before running it: what the step is about.")
    ask = models.TextField("the question", help_text="What to ask the class before running it.")
    point_at = models.TextField("what to point at", help_text="Afterwards: where to look, what it means.")

    class Meta:
        ordering = ["order", "id"]

    def __str__(self) -> str:
        return self.title

    @property
    def spec(self) -> Scenario | None:
        return SCENARIOS.get(self.scenario)

    def chosen_preset(self) -> Preset | None:
        spec = self.spec
        return next((p for p in spec.presets if p.slug == self.preset), None) if spec and self.preset else None

    def launch_data(self) -> dict[str, Any]:
        """What a launch of this step is given (the preset's parameters, then the step's own); ParamsError
        if the scenario or the preset is unknown or the parameters are not a JSON object."""
        spec = self.spec
        if spec is None:
            raise ParamsError({"scenario": [f"No scenario {self.scenario!r}: one of {', '.join(SCENARIOS)}."]})
        preset = self.chosen_preset()
        if self.preset and preset is None:
            known = ", ".join(p.slug for p in spec.presets) or "none"
            raise ParamsError({"preset": [f"{spec.title} has no preset {self.preset!r} (its presets: {known})."]})
        if not isinstance(self.params, dict):
            raise ParamsError({"params": ['Give the parameters as a JSON object, e.g. {"writers": 16}.']})
        return {**(preset.params if preset else {}), **self.params}

    def cleaned_params(self) -> dict[str, Any]:
        """The parameters a job of this step runs with, checked by the scenario's form; ParamsError otherwise."""
        data = self.launch_data()
        assert self.spec is not None  # launch_data refused an unknown scenario
        return self.spec.clean(data)

    def clean(self) -> None:
        try:
            self.cleaned_params()
        except ParamsError as refused:
            raise ValidationError(_on_fields(refused)) from None


_STEP_FIELDS = {"scenario", "preset", "params"}


def _on_fields(refused: ParamsError) -> dict[str, list[str]]:
    """A refusal as the admin shows it: the step's own fields by name, a scenario parameter's under
    `params`, named ("writers: Ensure this value is less than or equal to 64.")."""
    found: dict[str, list[str]] = {}
    for name, messages in refused.errors.items():
        if name in _STEP_FIELDS:
            found.setdefault(name, []).extend(messages)
        else:
            prefix = "" if name == "__all__" else f"{name}: "
            found.setdefault("params", []).extend(f"{prefix}{message}" for message in messages)
    return found


class LessonRun(models.Model):
    """One teaching of a lesson: who taught it, when, and the jobs each step launched."""

    lesson = models.ForeignKey(Lesson, on_delete=models.CASCADE, related_name="runs")
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    started_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.lesson} run {self.pk}"


class LessonRunJob(models.Model):
    """A job a step launched in a run (a step may be run several times: each is kept)."""

    run = models.ForeignKey(LessonRun, on_delete=models.CASCADE, related_name="jobs")
    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="run_jobs")
    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="lesson_run_job")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.run}: {self.step} -> job {self.job_id}"
