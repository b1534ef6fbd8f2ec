"""What a scenario declares, so that the rest of the app can show it without knowing it.

A scenario is one module (plus its template partials and at most one script) that
defines a `Scenario` subclass and an instance named `scenario`. From that declaration
alone the launch form, `runjob`'s flags, the live page, replay, compare, exports and
the JSON stream's `hello` are built:

- its parameters form: the only place each parameter's default, limits and help live;
- its presets, its actors' names, and its live state (the contended objects now);
- the event kinds it records, each with its sentence, its mark on the timeline and, for
  the kinds of interest, a caption saying what just happened and its Kubernetes
  counterpart (`EventKind`: the one vocabulary, sent to browsers rather than copied into scripts);
- the figures counted from its events (`Figure`), live, in replay and in compare;
- `run()`, which runs its actors and returns its summary with the invariant's verdict.

Parameters arrive from a launch form, the HTTP API or `runjob`'s flags; all go through
the scenario's form, so the same input gets the same error everywhere. Its numbers are
`WholeNumberField`s and `DecimalNumberField`s: ASCII digits only, each with bounds.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError

from occviz.jobs.figures import Figure
from occviz.jobs.recorder import EVENT_COLUMNS
from occviz.jobs.registry import ParamsError
from occviz.jobs.snapshots import State

if TYPE_CHECKING:
    from occviz.jobs.context import JobContext

__all__ = [
    "ERROR",
    "Control",
    "DecimalNumberField",
    "EventKind",
    "Figure",
    "ParamsError",
    "Preset",
    "Scenario",
    "ScenarioForm",
    "State",
    "WholeNumberField",
    "check_limit",
    "limit",
]

# Marks the timeline knows how to draw (static/occviz/viz.js).
MARKS = ("tick", "dot", "cross", "bar-after", "bar-before", "triangle", "square", "diamond", "star")

_PLACEHOLDER = re.compile(r"\{([a-z_][a-z_.0-9]*)(?::(ms|s))?\}")
# What a placeholder may name besides `detail.<key>`: an event's stored fields and the two `_value` derives.
_KNOWN_FIELDS = frozenset({"seq", *EVENT_COLUMNS, "who", "next_attempt"})


@dataclass(frozen=True)
class EventKind:
    """One kind of event: how it reads and how it is drawn.

    `sentences` are templates over the event's fields: `{version_read}`,
    `{detail.overwrote}`, `{duration_ms:ms}` (a duration, formatted), and `{who}` (the
    actor's name). The first template whose placeholders all have a value is used, so a
    kind can read differently when a detail is present. The same rules run in the
    browser (viz.js `sentence`).
    """

    name: str
    label: str
    sentences: tuple[str, ...]
    color: str
    mark: str = "dot"
    ring_when: str = ""
    """A detail key: when the event has it, the mark gets a red ring (a blind write over newer versions)."""
    ring_label: str = ""
    explain: str = ""
    """One more line for the mark's tooltip (what the Kubernetes API would answer, say)."""
    folds_into: str = ""
    """In the log, an event of this kind right after one of `folds_into` (same actor and op) ends that line..."""
    fold: str = ""
    """...with this text instead of a line of its own ("..., retry 2 in 50 ms")."""
    writes: bool = False
    """A write that landed on the event's `row` (`version_written` the version it made): in the object's history."""
    refused: bool = False
    """A write to the event's `row` refused for a stale version (`version_read` the one it had read): a conflict in
    the object's history."""
    captions: tuple[str, ...] = ()
    """One sentence a class reads as it happens: what just happened, and its Kubernetes counterpart. Templates as
    `sentences` (the first whose values are all there); a kind without any is not captioned."""
    key: bool = False
    """A moment that matters (a failover, a fenced write, a resync, an erased field): pinned in the key moments."""
    plural: str = ""
    """A captioned kind's events counted when they come faster than captions can be read ("and 41 more conflicts")."""
    singular: str = ""
    """The same for one of them ("and one more conflict"); by default the label."""

    def __post_init__(self) -> None:
        if self.mark not in MARKS:
            raise ValueError(f"event kind {self.name!r}: unknown mark {self.mark!r} (one of {', '.join(MARKS)})")
        for template in (*self.sentences, *self.captions, self.explain, self.fold):
            _check_template(self.name, template)
        for caption in self.captions:
            if "{" in _PLACEHOLDER.sub("", caption) or "}" in _PLACEHOLDER.sub("", caption):
                raise ValueError(f"event kind {self.name!r}: a brace that is no placeholder in caption {caption!r}")
        if self.captions and not self.plural:
            raise ValueError(f"event kind {self.name!r}: a captioned kind needs a plural noun to be counted by")
        if self.key and not self.captions:
            raise ValueError(f"event kind {self.name!r}: a key moment needs a caption to be listed by")
        if any(not caption.strip() for caption in self.captions):
            raise ValueError(f"event kind {self.name!r}: an empty caption")

    def sentence(self, event: Mapping[str, Any], who: str) -> str:
        for template in self.sentences:
            text = fill(template, event, who)
            if text is not None:
                return text
        return f"{who}: {self.label}"

    def caption(self, event: Mapping[str, Any], who: str) -> str | None:
        """The event's caption: its first template with every value present, or None (not captioned)."""
        return next((text for template in self.captions if (text := fill(template, event, who)) is not None), None)


def _check_template(kind: str, template: str) -> None:
    """Refuse a placeholder that names no field of an event: it could never be filled, here or in the browser."""
    for match in _PLACEHOLDER.finditer(template):
        path = match[1]
        if path not in _KNOWN_FIELDS and not (path.startswith("detail.") and len(path) > len("detail.")):
            raise ValueError(
                f"event kind {kind!r}: unknown placeholder {{{path}}} in {template!r} "
                f"(an event's field, detail.<key> or who)"
            )


def _value(event: Mapping[str, Any], path: str, who: str) -> Any:
    if path == "who":
        return who
    if path == "next_attempt":
        return None if event.get("attempt") is None else int(event["attempt"]) + 1
    if path.startswith("detail."):
        return (event.get("detail") or {}).get(path[len("detail.") :])
    return event.get(path)


def format_ms(ms: float) -> str:
    if ms >= 10_000:
        return f"{ms / 1000:.1f} s"
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"


def fill(template: str, event: Mapping[str, Any], who: str) -> str | None:
    """`template` with the event's values, or None if one of them is missing."""
    missing = False

    def replace(match: re.Match[str]) -> str:
        nonlocal missing
        value = _value(event, match[1], who)
        if value is None or value == "":
            missing = True
            return ""
        if match[2] == "ms":
            return format_ms(float(value))
        if match[2] == "s":
            return f"{float(value):.1f} s"
        # As the browser writes a number (JSON has no 1.0, only 1): the same words on both sides.
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value)

    text = _PLACEHOLDER.sub(replace, template)
    return None if missing else text


ERROR = EventKind(
    "error",
    "error",
    ("{who} failed: {detail.message}",),
    "#7a1010",
    "diamond",
    captions=("{who} failed and stopped: {detail.message}",),
    key=True,
    plural="errors",
)
"""Recorded by the runner when an actor fails: every scenario's vocabulary has it."""


class ScenarioForm(forms.Form):
    """A scenario's parameters form: a field left blank takes its initial value, the only default it has."""

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for name, form_field in self.fields.items():
            if data.get(name) in (None, "") and form_field.initial is not None:
                data[name] = form_field.initial
        return data


@dataclass(frozen=True)
class Preset:
    """A named starting point a teacher can click: a valid set of parameters."""

    slug: str
    title: str
    teaches: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Control:
    """A failure control a person can apply while the job runs (a button on each actor's row, or one for the job)."""

    action: str
    label: str
    help: str
    per_actor: bool = True
    adds_actor: bool = False
    """The control starts a new actor (its row appears once the control is applied)."""
    seconds: tuple[float, float] | None = None
    """The control lasts a number of seconds, within this range (a clock skew may be negative)."""
    unit: str = "s"
    """"ms": the page asks for its value in milliseconds (a latency), and the program still gets seconds."""


class Scenario:
    """Subclass, fill in the declarations, and define `run`; see the module docstring."""

    name: str
    title: str
    description: str
    form_class: type[forms.Form]
    sections: Mapping[str, Sequence[str]] = {}
    """The launch form's fields grouped under headings, in order; fields not named go last."""
    presets: tuple[Preset, ...] = ()
    kinds: tuple[EventKind, ...] = ()
    figures: tuple[Figure, ...] = ()
    rates: tuple[str, ...] = ()
    """Event kinds charted per second under the timeline."""
    actor_label = "actor {n}"
    actors_param = ""
    """The parameter that says how many actors (lanes) a job has."""
    state_keys: tuple[str, ...] = ()
    """The keys `read_state` puts into every frame."""
    state_template = ""
    """A template with a `state` partial that draws the live state (the page includes it)."""
    script = ""
    """A static script of the scenario's own (marks or a chart of its own), or ''."""
    compared: tuple[tuple[str, str], ...] = ()
    """Summary keys shown side by side in compare, with their labels."""
    controls: tuple[Control, ...] = ()
    """What a person can do to the job while it runs; `run()` takes them with `context.on_control`."""
    headless: Mapping[str, Any] = {}
    """Parameters `runjob` gives a job unless its flags say otherwise (a job stepped by hand runs itself there)."""
    list_params: tuple[str, ...] = ()
    """Parameters given as several words on the command line (`--skew replica-2=30 replica-3=-5`)."""
    state_title = "Contended objects"

    # -- what the runner calls ---------------------------------------------------------

    def clean(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """Validate `data` with the scenario's form; the cleaned parameters, or ParamsError.

        A parameter left out takes the form's initial value: the form is its only default.
        """
        defaults = {
            name: field.initial for name, field in self.form_class.base_fields.items() if field.initial is not None
        }
        form = self.form_class(data={**defaults, **data})
        if not form.is_valid():
            raise ParamsError({name: [str(message) for message in messages] for name, messages in form.errors.items()})
        return dict(form.cleaned_data)

    def run(self, context: JobContext) -> dict[str, Any]:
        raise NotImplementedError

    def connections(self, params: Mapping[str, Any]) -> int:
        """How many database connections a job with these (cleaned) parameters opens: one per actor."""
        return len(self.actor_names(params))

    # -- what the live stream and the pages read ---------------------------------------

    def read_state(self, job_id: int, params: Mapping[str, Any]) -> State:
        return State()

    def actor_names(self, params: Mapping[str, Any]) -> list[str]:
        count = int(params.get(self.actors_param) or 1) if self.actors_param else 1
        return [self.actor_name(n) for n in range(1, count + 1)]

    def actor_name(self, number: int) -> str:
        return self.actor_label.format(n=number)

    @property
    def actor_noun(self) -> str:
        """What one actor is called ("writer", "replica")."""
        return self.actor_label.replace("{n}", "").strip(" -_") or "actor"

    def setup(self, params: Mapping[str, Any]) -> str:
        """One line saying what a job with these parameters does (headers, job lists)."""
        return ", ".join(f"{key} {value}" for key, value in params.items() if value not in (None, ""))

    def tag(self, params: Mapping[str, Any]) -> str:
        """A short label telling this job apart from others of its scenario ("occ"), or "": the pages' tag."""
        return ""

    def kind(self, name: str) -> EventKind | None:
        return self._kinds.get(name)

    @functools.cached_property
    def _kinds(self) -> dict[str, EventKind]:
        return {kind.name: kind for kind in self.kinds}

    def who(self, event: Mapping[str, Any]) -> str:
        """The name of the event's lane: an outside writer's own (its detail says), else the actor's."""
        detail = event.get("detail")
        if isinstance(detail, str):
            detail = json.loads(detail or "null")
        lane = (detail or {}).get("lane")
        return str(lane) if lane else self.actor_name(int(event["actor"]))

    def describe(self, event: Mapping[str, Any]) -> str:
        """One event as a sentence a class can read aloud."""
        who = self.who(event)
        kind = self.kind(event["kind"])
        if kind is None:
            return f"{who}: {event['kind']}"
        return kind.sentence(event, who)

    def caption(self, event: Mapping[str, Any]) -> str | None:
        """The event's caption, or None for a kind that has none: the same words the pages show."""
        kind = self.kind(event["kind"])
        return None if kind is None else kind.caption(event, self.who(event))

    def vocabulary(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """What a client needs to draw and word this scenario's jobs: sent in the stream's hello."""
        return {
            "name": self.name,
            "title": self.title,
            "kinds": [
                asdict(kind) | {"sentences": list(kind.sentences), "captions": list(kind.captions)}
                for kind in self.kinds
            ],
            "figures": [figure.as_json() for figure in self.figures],
            "rates": list(self.rates),
            "actors": self.actor_names(params),
            "actor_label": self.actor_label,
            "state_keys": list(self.state_keys),
            "params": dict(params),
        }

    def control(self, action: str) -> Control | None:
        return next((control for control in self.controls if control.action == action), None)

    def control_seconds(self, action: str, params: Mapping[str, Any]) -> float | None:
        """How long a control with a duration lasts when the button is pressed (pause, cut-off)."""
        return None

    def shown_figures(self) -> list[Figure]:
        return [figure for figure in self.figures if figure.shown]

    def alarms(self, summary: Mapping[str, Any] | None) -> list[str]:
        """The summary's alarming figures above zero, worded ("344 lost updates").

        A job can keep its invariant and still have lost something (a `none` race counts its
        lost updates exactly): verdicts show these first, never as a plain success.
        """
        found = summary or {}
        return [
            f"{found[figure.key]} {figure.label}"
            for figure in self.figures
            if figure.alarm and isinstance(found.get(figure.key), int | float) and found[figure.key] > 0
        ]


def _ascii_only(value: Any) -> None:
    # int() and float() read any Unicode digits ("٣" is 3): a number here is written in 0-9.
    if isinstance(value, str) and not value.isascii():
        raise ValidationError(
            "Write the number with the digits 0-9: %(value)r is not.", code="not_ascii", params={"value": value.strip()}
        )


class WholeNumberField(forms.IntegerField):
    """A whole number written in ASCII digits (Django's IntegerField takes "٣" as 3)."""

    def to_python(self, value: Any) -> int | None:
        _ascii_only(value)
        return super().to_python(value)


class DecimalNumberField(forms.FloatField):
    """A finite number written in ASCII digits (Django's FloatField takes "٣" as 3.0)."""

    # The stubs give FloatField IntegerField's to_python (int | None); Django's returns a float.
    def to_python(self, value: Any) -> float | None:  # type: ignore[override]
        _ascii_only(value)
        return super().to_python(value)


def limit(setting: str) -> int:
    """A job limit from the settings, read at validation time so an override applies at once."""
    return int(getattr(settings, setting))


def check_limit(form: forms.Form, name: str, value: float | None, setting: str, unit: str) -> None:
    if value is not None and value > limit(setting):
        form.add_error(name, f"At most {limit(setting)} {unit} (the {setting} limit).")
