"""The sweep: the declaration (form, presets, kinds, figures).

For each level of concurrency (1, 2, 4, ... up to max_writers writers) and each chosen
strategy, one counter race of its own (a part of the sweep's job, with its own page), then
pgbench running the same compare-and-swap at the same client count. Each measured point is
an event, so the curve draws live, replays and exports. A job of it is job.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django import forms
from django.conf import settings

from occviz.concurrency.latency import MAX_LATENCY_MS
from occviz.concurrency.retry import PRESETS
from occviz.jobs.tasks import RUNNER_CONNECTIONS
from occviz.pgbench import PgbenchUnavailable, pgbench_path
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
    check_limit,
)
from occviz.scenarios.counter.actors import STRATEGIES
from occviz.scenarios.sweep import job
from occviz.scenarios.sweep.plan import DEFAULT_STRATEGIES, LATENCY, levels_of, over_latency, series_of

if TYPE_CHECKING:
    from occviz.jobs.context import JobContext

MAX_WRITERS = 64
MAX_POINT_SECONDS = 60


class WordsField(forms.CharField):
    """Words in one line of text ("occ atomic"); a list of them (from the API's JSON) is taken as that line."""

    def to_python(self, value: Any) -> str:
        if isinstance(value, list | tuple):
            value = " ".join(str(word) for word in value)
        return str(super().to_python(value))


class SweepForm(ScenarioForm):
    strategies = WordsField(
        max_length=100,
        initial=DEFAULT_STRATEGIES,
        help_text=f"The counter race's strategies to compare, e.g. occ atomic ({', '.join(STRATEGIES)}).",
    )
    max_writers = WholeNumberField(
        min_value=1,
        max_value=MAX_WRITERS,
        initial=16,
        label="Up to writers",
        help_text="The levels are 1, 2, 4, ... writers up to this (1 to 64); over latency, every point's writers.",
    )
    axis = forms.ChoiceField(
        choices=[("writers", "writers: 1, 2, 4, ... up to writers"), (LATENCY, "latency: 0 ms up to the latency")],
        required=False,
        initial="writers",
        label="x-axis",
        help_text="What moves from point to point: the number of writers, or their one-way network latency.",
    )
    max_latency_ms = DecimalNumberField(
        min_value=0.1,
        max_value=MAX_LATENCY_MS,
        required=False,
        initial=40.0,
        label="Up to latency (ms)",
        help_text="Over latency, the levels are 0 ms (direct), then an eighth, a quarter, a half and all of this.",
    )
    seconds = WholeNumberField(
        min_value=1,
        max_value=MAX_POINT_SECONDS,
        initial=3,
        label="Seconds per point",
        help_text="How long each counter race, and each pgbench run, lasts.",
    )
    think_ms = DecimalNumberField(
        min_value=0,
        required=False,
        initial=0,
        label="Think time (ms)",
        help_text="Between each writer's read and its write; pgbench sleeps as long.",
    )
    retry = forms.ChoiceField(
        choices=[(p, p) for p in PRESETS],
        required=False,
        initial="immediate",
        help_text="The retry policy of the writers that retry (occ, pessimistic, serializable).",
    )
    pgbench = forms.ChoiceField(
        choices=[("on", "on: the same transaction at each level"), ("off", "off")],
        required=False,
        initial="on",
        label="pgbench",
        help_text="pgbench runs the occ writer's read and compare-and-swap at the same client counts.",
    )

    def clean_strategies(self) -> str:
        chosen: list[str] = []
        for word in self.cleaned_data["strategies"].replace(",", " ").split():
            if word not in STRATEGIES:
                raise forms.ValidationError(
                    f"unknown strategy {word!r}: choose from {', '.join(STRATEGIES)}.", code="unknown_strategy"
                )
            if word not in chosen:
                chosen.append(word)
        if not chosen:
            raise forms.ValidationError("Name at least one strategy, e.g. occ atomic.", code="required")
        return " ".join(chosen)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        check_limit(self, "max_writers", data.get("max_writers"), "OCCVIZ_MAX_WRITERS", "writers")
        check_limit(self, "think_ms", data.get("think_ms"), "OCCVIZ_MAX_THINK_MS", "ms of think time")
        if self.errors:
            return data
        if data["pgbench"] == "on":
            try:
                pgbench_path()
            except PgbenchUnavailable as missing:
                self.add_error("pgbench", f"{missing} Or turn pgbench off.")
        count, series = len(levels_of(data)), len(series_of(data))
        total = count * series * data["seconds"]
        if total > settings.OCCVIZ_MAX_SECONDS:
            self.add_error(
                "seconds",
                f"{count} levels x {series} series x {data['seconds']} s is {total} s, more than the "
                f"{settings.OCCVIZ_MAX_SECONDS} s a job may run (the OCCVIZ_MAX_SECONDS limit): "
                f"fewer strategies, fewer writers or shorter points.",
            )
        return data


class Sweep(Scenario):
    name = "sweep"
    title = "Contention curve"
    description = (
        "The counter race at 1, 2, 4, ... 64 writers for chosen strategies, beside pgbench running the same "
        "transaction: committed per second and conflict rate against concurrency."
    )
    form_class = SweepForm
    sections = {
        "The curve": ("strategies", "axis", "max_writers", "max_latency_ms", "seconds"),
        "Each point": ("think_ms", "retry", "pgbench"),
    }
    actor_label = "series {n}"
    state_keys = ("series", "levels", "axis", "points", "rows", "running")
    state_template = "scenarios/sweep.html"
    state_title = "The contention curve"
    script = "occviz/scenarios/sweep.js"
    list_params = ("strategies",)
    kinds = (
        EventKind(
            "point_started",
            "point started",
            (
                "{detail.strategy} at {detail.writers} writers {detail.latency_ms} ms away: measuring for "
                "{detail.seconds} s",
                "{detail.strategy} at {detail.writers} writers: measuring for {detail.seconds} s",
            ),
            "#8a94a6",
            "tick",
        ),
        EventKind(
            "point",
            "point measured",
            (
                "{detail.strategy} at {detail.writers} writers {detail.latency_ms} ms away: {detail.commits_per_s} "
                "commits/s, {detail.conflicts_per_s} conflicts/s (conflict rate {detail.conflict_rate})",
                "{detail.strategy} at {detail.writers} writers: {detail.commits_per_s} commits/s, "
                "{detail.conflicts_per_s} conflicts/s (conflict rate {detail.conflict_rate})",
            ),
            "#1a9e4b",
            "dot",
            captions=(
                "{detail.strategy} with {detail.writers} writers {detail.latency_ms} ms from the database: "
                "{detail.commits_per_s} commits a second, {detail.conflicts_per_s} attempts a second refused "
                "(conflict rate {detail.conflict_rate}).",
                "{detail.strategy} with {detail.writers} writers: {detail.commits_per_s} commits a second, "
                "{detail.conflicts_per_s} attempts a second refused (conflict rate {detail.conflict_rate}).",
            ),
            plural="points",
        ),
        EventKind(
            "point_missing",
            "point missing",
            (
                "{detail.strategy} at {detail.writers} writers {detail.latency_ms} ms away not measured: "
                "{detail.reason}",
                "{detail.strategy} at {detail.writers} writers not measured: {detail.reason}",
            ),
            "#7a1010",
            "cross",
            captions=("{detail.strategy} at {detail.writers} writers could not be measured: {detail.reason}",),
            key=True,
            plural="missing points",
        ),
        EventKind(
            "point_stopped",
            "point stopped",
            ("{detail.strategy} at {detail.writers} writers stopped before it was measured ({detail.reason})",),
            "#4a5568",
            "square",
        ),
        ERROR,
    )
    figures = (
        Figure("points_measured", "points measured", count=("point",)),
        Figure("points_missing", "points missing", count=("point_missing",), alarm=True),
        Figure("peak_commits_per_s", "peak commits/s", from_state=True),
        # Words, too long for a figure's box: the curve's caption says where the peak is.
        Figure("peak_at", "peak at", from_state=True, shown=False),
    )
    rates = ()  # its own chart, the curve, says it all
    compared = (
        ("strategies", "strategies"),
        ("max_writers", "up to writers"),
        ("seconds", "seconds per point"),
        ("think_ms", "think time (ms)"),
        ("points_measured", "points measured"),
        ("peak_commits_per_s", "peak commits/s"),
        ("peak_at", "peak at"),
        ("duration_s", "duration (s)"),
    )
    # 5 s a point: long enough for a steady rate; each preset's whole sweep runs 75 to 105 s.
    presets = (
        Preset(
            "occ-against-atomic",
            "occ against atomic",
            "Compare-and-swap against an in-place increment, 1 to 64 writers, with pgbench as the yardstick.",
            {"strategies": "occ atomic", "max_writers": 64, "seconds": 5},
        ),
        Preset(
            "every-protected-strategy",
            "Every protected strategy",
            "occ, pessimistic, serializable and atomic from 1 to 8 writers: where each one bends.",
            {"strategies": "occ pessimistic serializable atomic", "max_writers": 8, "seconds": 5},
        ),
        Preset(
            "think-time",
            "With think time",
            "5 ms between read and write: the window for a conflict widens, and the curves part sooner.",
            {"strategies": "occ pessimistic", "max_writers": 16, "seconds": 5, "think_ms": 5},
        ),
    )

    def run(self, context: JobContext) -> dict[str, Any]:
        return job.run(context)

    def read_state(self, job_id: int, params: Mapping[str, Any]) -> State:
        return job.read_state(job_id, params)

    def connections(self, params: Mapping[str, Any]) -> int:
        # Its largest part: a counter race (or pgbench) at the top level, with that part's own runner.
        if over_latency(params):
            return int(params["max_writers"]) + RUNNER_CONNECTIONS
        return max(levels_of(params)) + RUNNER_CONNECTIONS

    def actor_names(self, params: Mapping[str, Any]) -> list[str]:
        return series_of(params)

    def who(self, event: Mapping[str, Any]) -> str:
        """An event's lane is its series: the strategy (or pgbench) its detail names."""
        detail = event.get("detail")
        if isinstance(detail, str):
            detail = json.loads(detail or "null")
        return str((detail or {}).get("strategy") or super().who(event))

    def tag(self, params: Mapping[str, Any]) -> str:
        return str(params.get("strategies") or "")

    def setup(self, params: Mapping[str, Any]) -> str:
        levels_run = levels_of(params)
        if over_latency(params):
            writers = int(params.get("max_writers") or 1)
            line = (
                f"{', '.join(series_of(params))} at {writers} writer{'s' * (writers != 1)}, "
                f"{', '.join(f'{ms:g}' for ms in levels_run)} ms away, {params.get('seconds')} s a point"
            )
            if params.get("think_ms"):
                line += f", think {params['think_ms']:g} ms"
            return line
        line = (
            f"{', '.join(series_of(params))} at {', '.join(map(str, levels_run))} writer{'s' * (levels_run != [1])}, "
            f"{params.get('seconds')} s a point"
        )
        if params.get("think_ms"):
            line += f", think {params['think_ms']:g} ms"
        return line


scenario = Sweep()
