"""What a scenario provides to the job runner, and the validation its three edges share.

Parameters arrive from a launch form, the HTTP API or `runjob`'s flags; all three
go through the scenario's Django form, so the same input gets the same error
everywhere and a job is only ever created from cleaned parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from django import forms
from django.conf import settings

if TYPE_CHECKING:
    from occviz.jobs.models import Job
    from occviz.jobs.runner import JobContext


class ParamsError(Exception):
    """Invalid job parameters: `errors` maps each field to its messages."""

    def __init__(self, errors: Mapping[str, list[str]]) -> None:
        self.errors = dict(errors)
        super().__init__("; ".join(f"{field}: {' '.join(messages)}" for field, messages in self.errors.items()))


class Scenario(Protocol):
    name: str
    title: str
    summary: str
    form_class: type[forms.Form]

    def run(self, job: Job, params: dict[str, Any], context: JobContext) -> dict[str, Any]:
        """Run the job's actors and return its summary, with `invariant_ok` and `invariant`."""
        ...


def clean_params(form_class: type[forms.Form], data: Mapping[str, Any]) -> dict[str, Any]:
    """Validate `data` with the scenario's form; the cleaned parameters, or ParamsError."""
    form = form_class(data=data)
    if not form.is_valid():
        raise ParamsError({field: [str(message) for message in messages] for field, messages in form.errors.items()})
    return form.cleaned_data


def limit(setting: str) -> int:
    """A job limit from the settings, read at validation time so an override applies at once."""
    return int(getattr(settings, setting))


def check_limit(form: forms.Form, field: str, value: float | None, setting: str, unit: str) -> None:
    if value is not None and value > limit(setting):
        form.add_error(field, f"At most {limit(setting)} {unit} (the {setting} limit).")
