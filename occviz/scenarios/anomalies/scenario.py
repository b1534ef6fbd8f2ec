"""The anomalies table: Hermitage's ten tests at three isolation levels, measured on real databases.

Each cell is decided by running Hermitage's PostgreSQL test scripts (occviz.steps.hermitage)
as step-mode jobs on fresh rows, not copied from a table: on the app's PostgreSQL always,
and on a MySQL or MariaDB server when the job names one. The job's verdict is whether
PostgreSQL's row equals the one Hermitage published. A job of it is job.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django import forms

from occviz.scenarios.anomalies import job
from occviz.scenarios.base import (
    ERROR,
    DecimalNumberField,
    EventKind,
    Figure,
    Preset,
    Scenario,
    ScenarioForm,
    State,
    WholeNumberField,
)
from occviz.scenarios.step.database import DatabaseField
from occviz.steps.hermitage import ANOMALIES, LEVELS, level_slug

if TYPE_CHECKING:
    from occviz.jobs.context import JobContext

ACTORS_NEEDED = 4
"""The most sessions one script's job opens: three transactions (OTV, Fekete's G2) and the observer."""


def _words(raw: str) -> list[str]:
    return raw.replace(",", " ").split()


class AnomaliesForm(ScenarioForm):
    database = DatabaseField(
        help_text="Also run the table on this MySQL or MariaDB server (one listed in OCCVIZ_MYSQL_URLS, e.g. "
        "mysql://root@127.0.0.1:3306/); empty: PostgreSQL only."
    )
    anomalies = forms.CharField(
        required=False,
        max_length=200,
        help_text=f"Only these, e.g. G0 P4 G-single (of {', '.join(ANOMALIES)}); empty: all ten.",
    )
    levels = forms.CharField(
        required=False,
        max_length=200,
        help_text="Only these, e.g. read-committed serializable; empty: all three.",
    )
    lock_timeout = DecimalNumberField(
        min_value=1, max_value=120, required=False, initial=10.0, label="Lock timeout (s)",
        help_text="How long a step of a script waits for a lock at most (1 to 120 s).",
    )  # fmt: skip
    step_ms = WholeNumberField(
        min_value=0,
        max_value=5_000,
        required=False,
        initial=0,
        label="Between steps (ms)",
        help_text="A pause after each step of each script, to follow the runs as they go.",
    )

    def clean_anomalies(self) -> str:
        known = {name.lower(): name for name in ANOMALIES}
        chosen = []
        for word in _words(self.cleaned_data.get("anomalies") or ""):
            name = known.get(word.lower())
            if name is None:
                raise forms.ValidationError(f"{word!r} is not one of Hermitage's anomalies ({', '.join(ANOMALIES)}).")
            chosen.append(name)
        return " ".join(name for name in ANOMALIES if name in chosen)

    def clean_levels(self) -> str:
        raw = (self.cleaned_data.get("levels") or "").lower()
        for level in LEVELS:
            raw = raw.replace(level, level_slug(level))
        known = {level_slug(level): level for level in LEVELS}
        chosen = []
        for word in _words(raw):
            if word not in known:
                raise forms.ValidationError(f"{word!r} is not a level ({', '.join(known)}).")
            chosen.append(word)
        return " ".join(level_slug(level) for level in LEVELS if level_slug(level) in chosen)


_CELL_SENTENCES = ("{who}: {detail.anomaly} at {detail.level}: {detail.how}.",)


class AnomaliesTable(Scenario):
    name = "anomalies"
    title = "Anomalies table"
    description = (
        "Hermitage's ten isolation anomalies at read committed, repeatable read and serializable, each test run "
        "for real as a step-mode job: which does the database prevent, and how?"
    )
    form_class = AnomaliesForm
    sections = {
        "Databases": ("database",),
        "Cells": ("anomalies", "levels"),
        "Runs": ("lock_timeout", "step_ms"),
    }
    list_params = ("anomalies", "levels")
    state_keys = ("anomalies", "tables", "progress", "unreachable", "differences", "done")
    state_template = "scenarios/anomalies.html"
    state_title = "The table so far"
    kinds = (
        EventKind("plan", "plan", ("{who}: {detail.scripts} scripts, {detail.cells} cells.",), "#b8c0cc", "tick"),
        EventKind("server", "server", ("{who} answered: {detail.server}.",), "#1c64d6", "tick"),
        EventKind("unreachable", "unreachable", ("{who} did not answer: {detail.message}.",), "#7a1010", "diamond"),
        EventKind("prevented", "prevented", _CELL_SENTENCES, "#1a9e4b", "dot"),
        EventKind("occurred", "occurred", _CELL_SENTENCES, "#d62828", "cross"),
        EventKind("failed", "not measured", _CELL_SENTENCES, "#7a1010", "diamond"),
        ERROR,
    )
    figures = (
        Figure("cells_measured", "cells measured", from_state=True),
        Figure("prevented", "prevented", count=("prevented",)),
        Figure("occurred", "occurred", count=("occurred",)),
        Figure("postgresql_differences", "differences from Hermitage (PostgreSQL)", from_state=True, alarm=True),
    )
    compared = (
        ("cells", "cells"),
        ("runs", "step jobs"),
        ("invariant", "verdict"),
    )
    presets = (
        Preset("postgresql", "PostgreSQL", "The whole table on the app's PostgreSQL.", {}),
        Preset(
            "mariadb",
            "PostgreSQL and MariaDB",
            "The same scripts on both, side by side.",
            {"database": "mysql://root@127.0.0.1:3306/"},
        ),
        Preset(
            "lost-update",
            "Lost update only",
            "P4 at each level: which one stops the lost update?",
            {"anomalies": "P4"},
        ),
    )

    def run(self, context: JobContext) -> dict[str, Any]:
        return job.run(context)

    def read_state(self, job_id: int, params: Mapping[str, Any]) -> State:
        return job.read_state(job_id, params)

    def actor_names(self, params: Mapping[str, Any]) -> list[str]:
        return [self.actor_name(n) for n in range(1, 3 if params.get("database") else 2)]

    def actor_name(self, number: int) -> str:
        return "PostgreSQL" if number == 1 else "MySQL server"

    def connections(self, params: Mapping[str, Any]) -> int:
        # Its parts run one at a time inside its admission: what the largest of them opens.
        return ACTORS_NEEDED

    def tag(self, params: Mapping[str, Any]) -> str:
        return "with MySQL" if params.get("database") else "PostgreSQL"

    def setup(self, params: Mapping[str, Any]) -> str:
        anomalies, levels = job.selected(params)
        where = "PostgreSQL" + (" and a MySQL server" if params.get("database") else "")
        return f"{len(anomalies)} anomalies at {len(levels)} levels on {where}"


scenario = AnomaliesTable()
