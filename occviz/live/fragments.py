"""The job page's live parts as HTML: rendered once per frame per process, for every viewer.

The page renders the same partials for its first paint (`first_render`); afterwards each
frame the stream sends it carries them, rendered with `oob=True`, and the page swaps
them in by id. Nothing here computes the job: totals and state come in the frames, the
sentences from the scenario's event kinds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from django.template.loader import render_to_string

from occviz.jobs.events import read_events
from occviz.jobs.snapshots import snapshot_at
from occviz.scenarios.base import Scenario, fill

if TYPE_CHECKING:
    from occviz.jobs.figures import Totals
    from occviz.live.frames import Frame
    from occviz.live.jobstate import JobState

LOG_LINES = 20
TEMPLATE = "live/job_live.html"
PARTIALS = ("status", "figures", "state", "log")

LogLine = tuple[int, str, str, str]  # (seq, kind, sentence, the kind's colour)


def log_lines(spec: Scenario, events: Iterable[Mapping[str, Any]]) -> list[LogLine]:
    """(seq, kind, sentence) for each event; a kind that folds (a retry after its conflict) ends the line before."""
    lines: list[LogLine] = []
    open_lines: dict[tuple[int, int, str], int] = {}  # (actor, op, kind) -> index of that line
    for event in events:
        kind = spec.kind(event["kind"])
        if kind is not None and kind.folds_into:
            index = open_lines.pop((event["actor"], event["op"], kind.folds_into), None)
            if index is not None:
                seq, line_kind, line, color = lines[index]
                lines[index] = (seq, line_kind, line + (fill(kind.fold, event, "") or ""), color)
                continue
        open_lines[(event["actor"], event["op"], event["kind"])] = len(lines)
        lines.append((event["seq"], event["kind"], spec.describe(event), kind.color if kind else ""))
    return lines


class LiveLog:
    """The latest LOG_LINES sentences of a job, newest last, kept across frames."""

    def __init__(self, spec: Scenario) -> None:
        self.spec = spec
        self.lines: deque[LogLine] = deque(maxlen=LOG_LINES)

    def add(self, events: list[dict[str, Any]]) -> None:
        self.lines.extend(log_lines(self.spec, events[-LOG_LINES:]))

    def newest_first(self) -> list[LogLine]:
        return list(reversed(self.lines))


def context(job: JobState, totals: Totals | None, state: Mapping[str, Any], log: LiveLog) -> dict[str, Any]:
    spec = job.info.spec
    return {
        "job": job.as_context(),
        "spec": spec,
        "figures": figure_values(spec, totals),
        "state": state,
        "state_template": f"{spec.state_template}#state" if spec.state_template else "",
        "lines": log.newest_first(),
    }


def figure_values(spec: Scenario, totals: Totals | None) -> list[dict[str, Any]]:
    """The figures panel: each shown figure with its value (None before the first event)."""
    values = []
    for figure in spec.shown_figures():
        value = None if totals is None else totals.get(figure.key)
        values.append(
            {
                "key": figure.key,
                "label": figure.label,
                "value": value,
                "percentiles": bool(figure.percentiles),
                "alarm": bool(figure.alarm and isinstance(value, int | float) and value > 0),
            }
        )
    return values


def render(ctx: dict[str, Any], *partials: str, oob: bool = True) -> str:
    return "".join(render_parts(ctx, *partials, oob=oob).values())


def render_parts(ctx: dict[str, Any], *partials: str, oob: bool = True) -> dict[str, str]:
    """Each partial rendered, by name, in the page's order."""
    ctx = {**ctx, "oob": oob}
    return {name: render_to_string(f"{TEMPLATE}#{name}", ctx) for name in partials or PARTIALS}


class FrameFragments:
    """Renders a job's fragments frame after frame and tells which changed, keeping one string per unchanged partial."""

    def __init__(self) -> None:
        self.latest: dict[str, str] = {}

    def next(self, job: JobState, frame: Frame, log: LiveLog) -> tuple[dict[str, str], dict[str, str]]:
        """(every partial as of `frame`, those that differ from the frame before); `log` has been given its events."""
        rendered = render_parts(context(job, frame["totals"], frame["state"], log))
        changed = {name: html for name, html in rendered.items() if self.latest.get(name) != html}
        # An unchanged partial keeps the previous frame's string: the window holds each text once.
        self.latest = {name: changed.get(name) or self.latest[name] for name in rendered}
        return dict(self.latest), changed


def context_at(job: JobState, seq: int) -> dict[str, Any]:
    """The fragments' context as of event `seq`: the snapshot at or before it, and the log of the events up to it."""
    snapshot = snapshot_at(job.info.id, seq) if seq > 0 else None
    log = LiveLog(job.info.spec)
    if seq > 0:
        log.add(read_events(job.info.id, max(0, seq - LOG_LINES), min(seq, LOG_LINES)))
    if snapshot is None:
        return context(job, None, {}, log)
    return context(job, snapshot["figures"], snapshot["state"], log)


def first_render_context(job: JobState) -> dict[str, Any]:
    """The fragments' context as the stream would send it now: as of the last stored event."""
    return context_at(job, job.last_seq)


def first_render(job: JobState, *, oob: bool = False) -> str:
    return render(first_render_context(job), oob=oob)
