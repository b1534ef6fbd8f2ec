"""The websocket of a job: its JSON event stream, for programs and for the job page alike.

It checks the session's user (occviz/live/auth.py) and, in asgi.py, the origin; it
follows the job through this process's JobFeed and reads the store only for history
the feed does not hold. With `html=1` (the job page) each frame also carries the
page's fragments, rendered once per frame by the feed for every such viewer. Nothing
here computes anything about the job: totals, state and verdicts come in the frames and
the job row. The protocol is documented in docs/live-protocol.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from occviz.live import fragments
from occviz.live.dbthreads import read_history
from occviz.live.feeds import JobFeed, subscribe, unsubscribe
from occviz.live.frames import WireFrame, merge_runs, wire_text
from occviz.live.history import fragments_at, history_pages
from occviz.live.jobstate import JobState, read_for_new_socket
from occviz.live.memory import open_sockets

# Close codes (4000-4999 are the application's own; see docs/live-protocol.md).
CLOSE_NOT_SIGNED_IN = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_BAD_REQUEST = 4400

# No socket has a channel of its own: its job's feed is the one member of the job's group in this process.
# (With the PostgreSQL layer, a socket's channel cost a database round trip for its advisory lock at every
# handshake, and a queue and a lock entry that outlived it.) Channels takes a layer alias it does not know as none.
NO_CHANNEL_LAYER = "occviz-sockets-have-no-channel"

MAX_CLIENT_MESSAGE = 1000  # characters: anything longer is not a message this protocol knows
# A close frame carries at most 125 bytes, 2 of them the code: a longer reason is cut (the error message has it whole).
MAX_CLOSE_REASON = 123


class RefusingConsumer(AsyncJsonWebsocketConsumer):
    """A socket that may refuse after accepting: the client reads why in an error message and in the close."""

    channel_layer_alias = NO_CHANNEL_LAYER

    # Channels' own dispatch and disconnect first run `close_old_connections` in the one thread that
    # every socket shares, for each message: each handshake and each close waited there behind the
    # feeds' reads. Every database call of these sockets closes its connection as it should already
    # (`database_sync_to_async` around each call, occviz/live/dbthreads.py's threads their own).

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        await self.disconnect(message["code"])
        raise StopConsumer()

    async def refuse(self, code: int, reason: str) -> None:
        await self.send_json({"type": "error", "code": code, "error": reason})
        await self.close(code=code, reason=close_reason(reason))


class UnknownPathConsumer(RefusingConsumer):
    """Every websocket path no route names: refused with 4404 and where the stream is, never a server error."""

    async def connect(self) -> None:
        await self.accept()
        await self.refuse(CLOSE_NOT_FOUND, f"no websocket at {self.scope['path']}: a job's is /ws/jobs/<id>/events/")


def close_reason(text: str) -> str:
    encoded = text.encode()
    if len(encoded) <= MAX_CLOSE_REASON:
        return text
    return encoded[: MAX_CLOSE_REASON - 3].decode(errors="ignore") + "..."


class JobEventsConsumer(RefusingConsumer):
    """`/ws/jobs/<id>/events/?after=<seq>[&html=1]`: hello, frames from the store, end."""

    state: JobState
    feed: JobFeed | None = None
    html = False

    counted = False

    async def connect(self) -> None:
        open_sockets.opened()
        self.counted = True
        # Accept before refusing, so the client gets a close code and reason instead of a bare HTTP 403.
        await self.accept()
        job_id = await self.job_to_follow()
        if job_id is None:
            return
        state = await read_for_new_socket(job_id)
        if state is None:
            await self.refuse(CLOSE_NOT_FOUND, f"job {job_id} does not exist")
            return
        self.state = state
        await self.start()

    async def job_to_follow(self) -> int | None:
        """The job this socket may follow (the path's, for a signed-in user), or None once it has refused."""
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(CLOSE_NOT_SIGNED_IN, "not signed in: open the socket with your session cookie")
            return None
        return int(self.scope["url_route"]["kwargs"]["job_id"])

    async def disconnect(self, code: int) -> None:
        await self.stop_following()
        if self.feed is not None:
            feed, self.feed = self.feed, None
            await unsubscribe(feed, html=self.html)
        if self.counted:
            self.counted = False
            open_sockets.closed()

    async def follow(self, after: int) -> AsyncIterator[list[WireFrame]]:
        """Every frame after `after`, in order, each sequence number once, in batches; ends when the job has.

        A batch is everything the feed holds past this viewer's position, so a viewer that
        fell behind (its task ran late while others were sent their frames) catches up in
        one step rather than frame by frame.
        """
        if not self.state.finished and self.feed is None:
            self.feed = await subscribe(self.state, html=self.html)
        position = after

        async def read_store(upto: int) -> WireFrame | None:
            return await history_pages().page(self.state.info, position, upto)

        while True:
            feed = self.feed
            if feed is None:  # a finished job: everything is in the store
                frame = await read_store(self.state.last_seq)
                if frame is None:
                    return
                position = frame.seq_to
                yield [frame]
                continue
            changed = feed.changed  # taken before looking, so a change while we send is not missed
            frames = feed.frames_after(position)
            if frames:
                position = frames[-1].seq_to
                yield frames
                continue
            until = feed.history_until(position)
            if until > position:  # history older than the feed's window, or the rest of a frame resumed inside
                frame = await read_store(until)
                if frame is not None:
                    position = frame.seq_to
                    yield [frame]
                    continue
            if feed.ended and position >= feed.state.last_seq:
                self.state = feed.state
                return
            await changed.wait()

    _task: asyncio.Task[None] | None = None

    def start_following(self, after: int) -> None:
        self._task = asyncio.create_task(self._stream(after))

    async def stop_following(self) -> None:
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def start(self) -> None:
        # Blank values kept: `after=` is a bad value, not a missing one.
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        raw_after = query.get("after", ["0"])[-1]
        after = _parsed_sequence_number(raw_after)
        if after is None:
            await self.refuse(CLOSE_BAD_REQUEST, f"after={raw_after!r} is not a sequence number (a whole number >= 0)")
            return
        raw_html = query.get("html", ["0"])[-1]
        if raw_html not in ("0", "1"):
            await self.refuse(CLOSE_BAD_REQUEST, f"html={raw_html!r}: give 1 (send the page's fragments) or 0")
            return
        self.html = raw_html == "1"
        await self.send_json(self.state.hello(after))
        self.start_following(after)

    async def _stream(self, after: int) -> None:
        job_id = self.state.info.id
        # Until this viewer has had every fragment once, its messages carry them all: before the feed's
        # frames it may have read history from the store (frames without fragments), or nothing.
        whole = True
        async for frames in self.follow(after):
            # consecutive frames go as one message, up to MAX_EVENTS_PER_FRAME events
            for run in merge_runs(frames):
                feed = self.feed
                if feed is not None and run[-1].html is None and self.html and whole:
                    # History read from the store, no fragments with it: the page gets them as of its end, or a
                    # job that then waits (stepped by hand) would show the page's first paint until it moves on.
                    await self.send(text_data=await self.with_fragments(job_id, run))
                    whole = False
                elif feed is None or run[-1].html is None:
                    await self.send(text_data=wire_text(job_id, run))
                else:
                    await self.send(text_data=feed.encoded(run, html=self.html, whole=whole))
                    whole = False
                # A send never waits (the server buffers it), so a viewer catching up would send its whole
                # history in one turn while the viewers following live wait: one message a turn, instead.
                await asyncio.sleep(0)
        end = self.state.end()
        if self.html:
            feed = self.feed
            end["html"] = await (feed.end_html() if feed else read_history(self.final_fragments))
        await self.send_json(end)
        await self.close(code=1000)

    async def with_fragments(self, job_id: int, run: list[WireFrame]) -> str:
        """The message for `run` with the page's fragments as of its last event (a copy: history frames are shared)."""
        last = copy.copy(run[-1])
        last.html = await fragments_at(self.state, last.seq_to)
        return wire_text(job_id, [*run[:-1], last], html=True, whole=True)

    def final_fragments(self) -> str:
        """The page's fragments once the job has ended: its verdict, final figures and state, last events."""
        return fragments.first_render(self.state, oob=True)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        # Validated here, at the edge: a bad message gets an error back and changes nothing.
        if text_data is None:
            await self.error("binary messages are not part of this protocol: send JSON text")
            return
        if len(text_data) > MAX_CLIENT_MESSAGE:
            await self.error(f"message too long ({len(text_data)} characters; at most {MAX_CLIENT_MESSAGE})")
            return
        try:
            content = json.loads(text_data)
        except ValueError:
            await self.error('not JSON: send {"type": "resume", "after": <seq>}')
            return
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict) or content.get("type") != "resume":
            await self.error('unknown message: the only one is {"type": "resume", "after": <seq>}')
            return
        after = _sequence_number(content.get("after"))
        if after is None or set(content) - {"type", "after"}:
            await self.error('resume needs "after": a whole number >= 0 (a number, not a string), and nothing else')
            return
        await self.stop_following()
        self.start_following(after)

    async def error(self, message: str) -> None:
        await self.send_json({"type": "error", "code": CLOSE_BAD_REQUEST, "error": message})


def _sequence_number(value: Any) -> int | None:
    """A sequence number from JSON: a number, never a string or a boolean."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    return None


def _parsed_sequence_number(text: str) -> int | None:
    """A sequence number from the query string: digits only (no sign, no blank)."""
    if text.isascii() and text.isdigit() and len(text) <= 18:
        return int(text)
    return None
