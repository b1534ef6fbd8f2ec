"""Job feeds: one per job per web process, so N viewers of a live job cost one read per batch, not N.

A feed joins the channel group `job-<id>` once, and on each `job.progress` message
reads the newly stored range from PostgreSQL once, as frames (at most
MAX_EVENTS_PER_FRAME events each), which it keeps in a short in-memory window.
Every viewer of the job in this process takes its frames from that window; only a
viewer that is behind the window (it resumed from an old sequence number) or resumed
inside one of its frames reads the store itself, to catch up.

Each window frame's events come encoded to JSON by PostgreSQL as it is read
(`WireFrame`): the process builds no object per event. A viewer
that is behind by several frames gets them merged into one message (at most
MAX_EVENTS_PER_FRAME events) by joining their encoded text: the cost of a viewer is
one string per message it is sent, whatever the number of events, and viewers at the
same position share that string.

The layer may drop messages, so the feed also polls the job row (one query a
second per job, not per viewer) when the layer has been silent: a dropped progress
message only delays frames, a dropped end message only delays the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import deque
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from occviz.jobs.events import read_events
from occviz.live import fragments
from occviz.live.frames import StoreReader, WireFrame, wire_text
from occviz.live.jobstate import JobState, aread_job_state
from occviz.live.publish import group_name

logger = logging.getLogger(__name__)

# The window of recent frames a feed keeps for viewers that are a little behind.
WINDOW_EVENTS = 20_000
# With no message from the layer for this long, the feed asks the job row itself.
POLL_INTERVAL_S = 1.0


class JobFeed:
    def __init__(self, state: JobState) -> None:
        self.job_id = state.info.id
        self.state = state
        self.frames: deque[WireFrame] = deque()
        self._window_events = 0
        # Frames after this sequence number are (or will be) in the window; before it, viewers read the store.
        self.window_after = state.last_seq
        self.known_seq = state.last_seq
        self.changed = asyncio.Event()
        self._reader = StoreReader(state.info, state.last_seq)
        self.log = fragments.LiveLog(state.info.spec)
        self._fragments = fragments.FrameFragments()
        self._advancing = asyncio.Lock()
        self._heard = asyncio.Event()
        self._channel = ""
        self._tasks: list[asyncio.Task[None]] = []
        self._texts: dict[tuple[int, int, bool, bool], str] = {}
        self._end_html: str | None = None
        self._ending = asyncio.Lock()
        self.viewers = 0
        self.html_viewers = 0
        """Viewers that want the page's fragments with each frame: rendered here, once, for all of them."""

    # -- what viewers read --------------------------------------------------------

    @property
    def ended(self) -> bool:
        """The job is finished and every one of its events is in the window."""
        return self.state.finished and self._reader.position >= self.state.last_seq

    def frames_after(self, position: int) -> list[WireFrame]:
        """The window's frames after `position`, contiguous from position + 1 (cut if one starts earlier).

        Looked for from the newest frame back: a viewer is usually a frame or two behind, and every
        viewer asks at every frame, so the cost is what it is sent, not the window's length.
        """
        found: list[WireFrame] = []
        for frame in reversed(self.frames):
            if frame.seq_to <= position:
                break
            found.append(frame)
        if not found or found[-1].seq_from > position + 1:
            return []  # nothing new, or the window starts later: the viewer reads the store first
        if found[-1].seq_from <= position:
            return []  # the viewer resumed inside a frame (frames are never cut): it reads the store to its end
        found.reverse()
        return found

    def history_until(self, position: int) -> int:
        """Up to where a viewer at `position` reads the store itself before the window serves it.

        The window's start, if the viewer is behind it; the end of the window's frame it resumed
        inside (frames are encoded whole, so never cut), if it did; else `position` (nothing).
        """
        if position < self.window_after:
            return self.window_after
        for frame in reversed(self.frames):
            if frame.seq_to <= position:
                break
            if frame.seq_from <= position:
                return frame.seq_to
        return position

    def encoded(self, parts: list[WireFrame], *, html: bool = False, whole: bool = False) -> str:
        """One message for consecutive frames, built once for all the viewers that are sent the same range."""
        key = (parts[0].seq_from, parts[-1].seq_to, html, whole)
        text = self._texts.get(key)
        if text is None:
            text = wire_text(self.job_id, parts, html=html, whole=whole)
            if len(self._texts) >= 2 * len(self.frames) + 16:
                self._texts.clear()  # a cache of the window's ranges only: viewers are rarely far apart
            self._texts[key] = text
        return text

    async def end_html(self) -> str:
        """The page's fragments once the job has ended, rendered once for every viewer in this process.

        From the last frame's totals and state (no recount of the job's events) and the final job row.
        """
        async with self._ending:
            if self._end_html is None:
                last = self.frames[-1].frame if self.frames else None
                if last is None or last["seq_to"] < self.state.last_seq:
                    self._end_html = await database_sync_to_async(fragments.first_render)(self.state, oob=True)
                else:
                    ctx = fragments.context(self.state, last["totals"], last["state"], self.log)
                    self._end_html = await database_sync_to_async(fragments.render)(ctx)
            return self._end_html

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        layer = get_channel_layer()
        if layer is not None:
            try:
                self._channel = await layer.new_channel()
                await layer.group_add(group_name(self.job_id), self._channel)
            except Exception:
                logger.warning("live: job %s: channel layer unavailable, polling only", self.job_id, exc_info=True)
                self._channel = ""
        # Re-read after joining the group: a batch stored in between is not missed.
        state = await aread_job_state(self.job_id)
        if state is not None:
            self._set_state(state)
        if self._channel:
            self._tasks.append(asyncio.create_task(self._listen()))
        self._tasks.append(asyncio.create_task(self._poll()))
        await self._advance()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        layer = get_channel_layer()
        if self._channel and layer is not None:
            with contextlib.suppress(Exception):
                await layer.group_discard(group_name(self.job_id), self._channel)

    # -- keeping up -------------------------------------------------------------------

    async def _listen(self) -> None:
        layer = get_channel_layer()
        assert layer is not None
        while True:
            try:
                message = await layer.receive(self._channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("live: job %s: receiving from the layer failed", self.job_id, exc_info=True)
                await asyncio.sleep(POLL_INTERVAL_S)
                continue
            self._heard.set()
            try:
                await self.handle(message)
            except Exception:
                logger.exception("live: job %s: handling %s failed", self.job_id, message.get("type"))

    async def handle(self, message: dict[str, Any]) -> None:
        if message.get("type") == "job.progress":
            self.known_seq = max(self.known_seq, int(message["seq_to"]))
            if self.state.status == "queued":
                # Read before the job started: without a fresh row the status fragment says "queued" all run.
                state = await aread_job_state(self.job_id)
                if state is not None:
                    self._set_state(state)
            await self._advance()
        elif message.get("type") == "job.status":
            state = await aread_job_state(self.job_id)
            if state is not None:
                self._set_state(state)
            await self._advance()

    async def _poll(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._heard.wait(), POLL_INTERVAL_S)
            if self._heard.is_set():
                self._heard.clear()
                continue
            try:
                state = await aread_job_state(self.job_id)
                if state is not None and (state.status != self.state.status or state.last_seq > self.known_seq):
                    self._set_state(state)
                    await self._advance()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("live: job %s: polling failed", self.job_id, exc_info=True)

    def _set_state(self, state: JobState) -> None:
        changed = state.status != self.state.status
        self.state = state
        self.known_seq = max(self.known_seq, state.last_seq)
        if changed:
            self._notify()

    async def _advance(self) -> None:
        """Read what is stored up to `known_seq` into the window, one frame per MAX_EVENTS_PER_FRAME events."""
        async with self._advancing:
            while self._reader.position < self.known_seq:
                # read and encoded in the database thread, once for every viewer in this process
                frame = await database_sync_to_async(self._read_encoded)(self.known_seq)
                if frame is None:
                    break
                self.frames.append(frame)
                self._window_events += frame.count
                while len(self.frames) > 1 and self._window_events - self.frames[0].count >= WINDOW_EVENTS:
                    dropped = self.frames.popleft()
                    self._window_events -= dropped.count
                    self.window_after = dropped.seq_to
                self._notify()
            if self.ended:
                self._notify()

    def _read_encoded(self, upto: int) -> WireFrame | None:
        # Events encoded by PostgreSQL, one string a frame: the process builds no object per event.
        wire = self._reader.next_frame(upto)
        if wire is None:
            return None
        if self.html_viewers:
            # The log shows the last LOG_LINES events only: those are read as values.
            last = min(wire.count, fragments.LOG_LINES)
            self.log.add(read_events(self.job_id, wire.seq_to - last, last))
            wire.html, wire.changed_html = self._fragments.next(self.state, wire.frame, self.log)
        return wire

    def _notify(self) -> None:
        # Viewers hold the event they waited on; a fresh one is armed for the next change.
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()


_feeds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, JobFeed]] = weakref.WeakKeyDictionary()
_starting: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


async def subscribe(state: JobState, *, html: bool = False) -> JobFeed:
    """The feed of this job in this process (started on first use); pair with `unsubscribe`."""
    loop = asyncio.get_running_loop()
    feeds = _feeds.setdefault(loop, {})
    async with _starting.setdefault(loop, asyncio.Lock()):
        feed = feeds.get(state.info.id)
        if feed is None:
            feed = JobFeed(state)
            feeds[state.info.id] = feed
            # Counted before it starts: the frames it reads on starting (a job that began meanwhile) carry
            # the fragments its first viewer wants, or a job that then waits (stepped by hand) shows none.
            feed.viewers, feed.html_viewers = 1, int(html)
            try:
                await feed.start()
            except BaseException:
                del feeds[state.info.id]
                await feed.stop()
                raise
        else:
            feed.viewers += 1
            feed.html_viewers += html
    return feed


async def unsubscribe(feed: JobFeed, *, html: bool = False) -> None:
    loop = asyncio.get_running_loop()
    feeds = _feeds.get(loop, {})
    feed.viewers -= 1
    feed.html_viewers -= html
    if feed.viewers <= 0 and feeds.get(feed.job_id) is feed:
        del feeds[feed.job_id]
        await feed.stop()
