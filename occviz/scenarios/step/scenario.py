"""Step mode: the declaration (form, kinds, figures, the step control).

2 to 4 actors T1..T4, each with its own real connection and transaction, run a script of
SQL steps (occviz.steps) one step at a time: by hand, the teacher advancing one actor per
click (the `step` control), or by themselves in the script's written order. A job of it is
job.py; its state and summary, folded from its events, state.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django import forms

from occviz.scenarios.base import (
    ERROR,
    Control,
    DecimalNumberField,
    EventKind,
    Figure,
    Preset,
    Scenario,
    ScenarioForm,
    State,
    WholeNumberField,
)
from occviz.scenarios.step import job
from occviz.scenarios.step.database import DatabaseField
from occviz.scenarios.step.scripts import BY_HAND, DEFAULT_SCRIPT, WRITTEN_ORDER, script_of
from occviz.steps.builtin import BUILTINS, scripts
from occviz.steps.script import ISOLATION_LEVELS, MAX_TEXT, ScriptError, parse

if TYPE_CHECKING:
    from occviz.jobs.context import JobContext

LEVELS = ISOLATION_LEVELS[1:]  # PostgreSQL runs read uncommitted as read committed: not offered as a default


def _script_choices() -> list[tuple[str, str]]:
    return [("", "(a script of my own, below)")] + [(name, name) for name in scripts()]


class StepForm(ScenarioForm):
    script = forms.ChoiceField(
        choices=_script_choices,
        required=False,
        help_text="A built-in script (lost-update unless you write one below).",
    )
    text = forms.CharField(
        label="Or a script of your own",
        required=False,
        max_length=MAX_TEXT,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 10, "cols": 60, "spellcheck": "false"}),
        help_text="One step a line, e.g. T1: update test set value = 11 where id = 1. Actors T1 to T4; "
        "optional first line rows: 1=10 2=20.",
    )
    isolation = forms.ChoiceField(
        choices=[(level, level) for level in LEVELS],
        required=False,
        initial="read committed",
        help_text="The level of a plain begin, and of an actor's first statement without one.",
    )
    lock_timeout = DecimalNumberField(
        min_value=1, max_value=120, required=False, initial=30.0, label="Lock timeout (s)",
        help_text="How long a step waits for a lock before it fails (1 to 120 s).",
    )  # fmt: skip
    pace = forms.ChoiceField(
        choices=[(BY_HAND, BY_HAND), (WRITTEN_ORDER, WRITTEN_ORDER)],
        required=False,
        initial=BY_HAND,
        help_text="By hand: each click on an actor runs its next step. Written order: the script runs by itself.",
    )
    database = DatabaseField()
    step_ms = WholeNumberField(
        min_value=0,
        max_value=5_000,
        required=False,
        initial=0,
        label="Between steps (ms)",
        help_text="In written order: the pause after each step.",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        name, text = data.get("script") or "", data.get("text") or ""
        if name and text.strip():
            self.add_error("text", "Choose a built-in script or write one, not both.")
            return data
        if not text.strip():
            data["script"], data["text"] = name or DEFAULT_SCRIPT, ""
            return data
        try:
            parse(text)
        except ScriptError as wrong:
            self.add_error("text", str(wrong))
        return data


_SQLSTATE = "{detail.sqlstate}: {detail.message}"


class StepScenario(Scenario):
    name = "step"
    title = "Step mode"
    description = (
        "Two to four transactions, each on its own real connection, stepped one statement at a time: "
        "predict, then see who blocks, who is aborted, and which rows each one sees."
    )
    form_class = StepForm
    sections = {
        "Script": ("script", "text"),
        "Transactions": ("isolation", "lock_timeout", "database"),
        "Pace": ("pace", "step_ms"),
    }
    actor_label = "T{n}"
    state_keys = ("rows", "actors", "script", "question")
    state_template = "scenarios/step.html"
    script = "occviz/step.js"
    state_title = "The rows, and what each transaction sees"
    headless = {"pace": WRITTEN_ORDER}
    controls = (
        Control("step", "Step", "Run this actor's next step.", per_actor=True),
        Control("next", "Next line", "Run the script's next line, in its written order.", per_actor=False),
    )
    kinds = (
        EventKind(
            "ready", "connected", ("{who} connected: its own session (backend {detail.pid}).",), "#b8c0cc", "tick"
        ),
        EventKind(
            "begin",
            "begin",
            ("{who} began a {detail.began} transaction.",),
            "#1c64d6",
            "tick",
        ),
        EventKind(
            "read",
            "read",
            ("{who} read {detail.values}: {detail.step}.",),
            "#7cc89a",
            "dot",
        ),
        EventKind("write", "write", ("{who} wrote {detail.values}: {detail.step}.",), "#0f766e", "dot"),
        EventKind("insert", "insert", ("{who} inserted {detail.values}.",), "#0f766e", "square"),
        EventKind("delete", "delete", ("{who} deleted {detail.values}.",), "#7a4b10", "square"),
        EventKind(
            "conflict",
            "conflict",
            ("{who}'s compare-and-swap matched no row: the version it read had moved on ({detail.step}).",),
            "#d62828",
            "cross",
            refused=True,
            captions=(
                "{who}'s update matched no row: the version it read was no longer there. The write is refused; in "
                "Kubernetes this is 409 Conflict, and the client re-reads and tries again.",
            ),
            plural="conflicts",
            key=True,
        ),
        EventKind(
            "blocked",
            "blocked",
            ("{who} is blocked: {detail.step} waits for {detail.waiting_on}.", "{who} is blocked: {detail.step}."),
            "#f08c00",
            "bar-after",
            captions=(
                "{who} waits for {detail.waiting_on}: it asked for a row lock {detail.waiting_on} holds, and goes on "
                "by itself when {detail.waiting_on} commits or aborts.",
            ),
            plural="lock waits",
            key=True,
        ),
        EventKind(
            "resumed",
            "resumed",
            (
                "{who} went on after {duration_ms:ms}: {detail.step} gave {detail.values}.",
                "{who} went on after {duration_ms:ms}: {detail.step}.",
            ),
            "#1a9e4b",
            "bar-before",
            captions=("{who}'s blocked step went on after {duration_ms:ms}: the lock it waited for was released.",),
            plural="resumed steps",
        ),
        EventKind(
            "commit",
            "commit",
            ("{who} committed.",),
            "#1a9e4b",
            "star",
        ),
        EventKind(
            "abort",
            "abort",
            ("{who}'s transaction was rolled back: {detail.message}.", "{who} aborted: its writes are undone."),
            "#7a1010",
            "square",
        ),
        EventKind(
            "serialization_failure",
            "serialization failure",
            (f"{{who}}: {_SQLSTATE}.",),
            "#9b1c9b",
            "diamond",
            captions=(
                "{who} got SQLSTATE {detail.sqlstate}, {detail.message}: PostgreSQL refused a transaction that could "
                "not have run alone in some order. The application retries it from the start.",
            ),
            plural="serialization failures",
            key=True,
        ),
        EventKind(
            "deadlock",
            "deadlock victim",
            (f"{{who}} was chosen as the deadlock's victim: {_SQLSTATE}.",),
            "#7a1010",
            "diamond",
            captions=(
                "Deadlock: each waited for the other. PostgreSQL chose {who} as the victim and aborted its "
                "transaction (SQLSTATE {detail.sqlstate}), so the other can go on.",
            ),
            plural="deadlocks",
            key=True,
        ),
        EventKind(
            "lock_timeout",
            "lock timeout",
            (f"{{who}} waited too long: {_SQLSTATE}.",),
            "#f08c00",
            "diamond",
            captions=("{who} gave up waiting for a lock after the lock timeout (SQLSTATE {detail.sqlstate}).",),
            plural="lock timeouts",
        ),
        EventKind("step_error", "error", (f"{{who}}: {_SQLSTATE}.", "{who}: {detail.message}."), "#7a1010", "diamond"),
        ERROR,
    )
    figures = (
        Figure("steps_taken", "steps taken", from_state=True),
        Figure("reads", "reads", count=("read",)),
        Figure("writes", "writes", count=("write", "insert", "delete")),
        Figure("conflicts", "conflicts", count=("conflict",)),
        Figure("lock_waits", "lock waits", count=("blocked",)),
        Figure("commits", "commits", count=("commit",)),
        Figure("aborts", "aborts", count=("abort",)),
        Figure("serialization_failures", "serialization failures", count=("serialization_failure",)),
        Figure("deadlocks", "deadlocks", count=("deadlock",)),
        Figure("lock_timeouts", "lock timeouts", count=("lock_timeout",)),
        Figure("errors", "errors", count=("step_error",)),
        Figure("lost_updates", "lost updates", from_state=True, alarm=True),
    )
    rates = ()
    compared = (
        ("script", "script"),
        ("isolation", "isolation"),
        ("steps_taken", "steps"),
        ("lock_waits", "lock waits"),
        ("conflicts", "conflicts"),
        ("serialization_failures", "serialization failures"),
        ("deadlocks", "deadlocks"),
        ("lost_updates", "lost updates"),
        ("final_text", "final rows"),
    )
    presets = tuple(
        Preset(name, builtin.title, builtin.question, {"script": name, "pace": BY_HAND})
        for name, builtin in BUILTINS.items()
    )

    def run(self, context: JobContext) -> dict[str, Any]:
        return job.run(context)

    def read_state(self, job_id: int, params: Mapping[str, Any]) -> State:
        return job.read_state(job_id, params)

    def actor_names(self, params: Mapping[str, Any]) -> list[str]:
        try:
            script, _ = script_of(params)
        except (ScriptError, KeyError):
            return []
        return list(script.actors)

    def connections(self, params: Mapping[str, Any]) -> int:
        return len(self.actor_names(params)) + 1  # each actor's session, and the observer's

    def tag(self, params: Mapping[str, Any]) -> str:
        return str(params.get("script") or "own script")

    def setup(self, params: Mapping[str, Any]) -> str:
        try:
            script, _ = script_of(params)
        except (ScriptError, KeyError):
            return "an invalid script"
        what = params.get("script") or "a script of its own"
        return (
            f"{what}: {len(script.steps)} steps of {', '.join(script.actors)}, {params.get('pace')}, "
            f"default {params.get('isolation')}, lock timeout {params.get('lock_timeout'):g} s"
        )


scenario = StepScenario()
