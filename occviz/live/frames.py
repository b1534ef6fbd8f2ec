"""Frames: what a viewer of a job receives, built only from what PostgreSQL has stored.

A frame covers the events `seq_from..seq_to` of one job, with what the job showed as
of `seq_to`: its figures (`totals`) and its scenario's state (the contended objects),
both from the snapshot its runner stored with the batch at or before `seq_to`
(`occviz.jobs.snapshots`). Nothing here counts or reads a scenario's state: a frame
read back from the store after a reconnect says exactly what the live one said.

All functions here are synchronous and use Django's connection: callers in async
code wrap them in `database_sync_to_async`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from occviz.jobs.events import read_events_json
from occviz.jobs.figures import Totals
from occviz.jobs.snapshots import snapshot_or_empty
from occviz.scenarios import SCENARIOS
from occviz.scenarios.base import Scenario

# A frame never carries more events than this; a longer range becomes several frames.
MAX_EVENTS_PER_FRAME = 2000


class Frame(TypedDict):
    type: str
    job: int
    seq_from: int
    seq_to: int
    totals: Totals
    state: dict[str, Any]
    """The scenario's live state (the counter's `rows`, ...): sent as keys of the frame itself."""


_BARE = Scenario()


@dataclass(frozen=True)
class JobInfo:
    """What the frame builders need to know about a job (read once, not per frame)."""

    id: int
    scenario: str
    params: dict[str, Any]

    @property
    def spec(self) -> Scenario:
        """The job's scenario; a bare one (no figures, no state) if it is not installed here."""
        return SCENARIOS.get(self.scenario, _BARE)


class WireFrame:
    """A frame with its JSON in two parts, so consecutive frames merge by joining text.

    `events_json` is the frame's events as arrays (EVENT_FIELDS order), comma-separated,
    without the enclosing brackets, as PostgreSQL encoded them; `tail_json` is
    `,"totals":{...},<state>` (the counter's state is `"rows":[...]`). A merged frame takes
    the events of all its parts and the tail (totals and state as of its `seq_to`) of the
    last one, which is exactly what one frame over the whole range says. A frame is never
    cut: a viewer that resumes inside one reads the rest of it from the store.
    """

    __slots__ = ("changed_html", "count", "events_json", "frame", "html", "tail_json")

    def __init__(self, frame: Frame, count: int, events_json: str) -> None:
        self.frame = frame
        self.count = count
        self.events_json = events_json
        tail = json.dumps({"totals": frame["totals"], **frame["state"]}, separators=(",", ":"))
        self.tail_json = "," + tail[1:-1]  # without the braces: wire_text closes it, after any fragments
        self.html: dict[str, str] | None = None
        """The page's fragments (by partial) as of this frame, when someone in this process watches with `html=1`."""
        self.changed_html: dict[str, str] | None = None
        """Those of them that differ from the frame before's."""

    @property
    def seq_from(self) -> int:
        return self.frame["seq_from"]

    @property
    def seq_to(self) -> int:
        return self.frame["seq_to"]


def wire_text(job_id: int, parts: Sequence[WireFrame], *, html: bool = False, whole: bool = False) -> str:
    """One `frame` message covering consecutive `parts` (seq_from of the first to seq_to of the last).

    With `html`, the page's fragments that changed over these parts go with it, as of the
    last part (when it has them): a fragment no frame changed is not sent again. With
    `whole`, every fragment goes (a viewer's first message, which may follow a gap).
    """
    fragments: dict[str, str] = {}
    if html and whole:
        fragments = parts[-1].html or {}
    elif html:
        for part in parts:
            fragments.update(part.changed_html or {})
    return (
        f'{{"type":"frame","job":{job_id},"seq_from":{parts[0].seq_from},"seq_to":{parts[-1].seq_to},'
        f'"events":[{",".join(part.events_json for part in parts)}]{parts[-1].tail_json}'
        + (f',"html":{json.dumps("".join(fragments.values()))}}}' if fragments else "}")
    )


def merge_runs(parts: Sequence[WireFrame], limit: int = MAX_EVENTS_PER_FRAME) -> list[list[WireFrame]]:
    """Consecutive parts grouped so that each group holds at most `limit` events (a part is never split)."""
    runs: list[list[WireFrame]] = []
    count = 0
    for part in parts:
        if runs and count + part.count <= limit:
            runs[-1].append(part)
            count += part.count
        else:
            runs.append([part])
            count = part.count
    return runs


class StoreReader:
    """Reads one job's frames from the store, from a position on.

    Used by a job feed (once per process, for everyone watching) and by a viewer that
    must catch up on history the feed does not hold.
    """

    def __init__(self, job: JobInfo, after: int) -> None:
        self.job = job
        self.position = after

    def next_frame(self, upto: int, *, limit: int = MAX_EVENTS_PER_FRAME) -> WireFrame | None:
        """The next frame after `position` reaching at most `upto`, or None if there is nothing new.

        Its events are encoded by PostgreSQL: one string a frame here, not an object a value.
        """
        if upto <= self.position:
            return None
        page = read_events_json(self.job.id, self.position, min(limit, upto - self.position))
        if page is None:
            return None
        seq_from, seq_to, count, events_json = page
        self.position = seq_to
        snapshot = snapshot_or_empty(self.job.id, seq_to)
        frame: Frame = {
            "type": "frame",
            "job": self.job.id,
            "seq_from": seq_from,
            "seq_to": seq_to,
            "totals": snapshot["figures"],
            "state": snapshot["state"],
        }
        return WireFrame(frame, count, events_json)

    def seek(self, position: int) -> None:
        """Move to another position (a client's resume)."""
        self.position = position
