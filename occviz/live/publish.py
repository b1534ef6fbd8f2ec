"""The one place that tells viewers about a job: "job <id> has events up to <seq>", and when it ends.

`JobPublisher` is a job observer (the live app registers it with the runner). After
each stored batch (at most about ten a second, the recorder's flush interval) it sends
one small message to the channel group `job-<id>`: the sequence number reached. The
events, and the snapshot of what the job shows as of each batch, are in PostgreSQL, and
each web process reads a new range once for all its viewers (`occviz.live.feeds`).
Keeping messages small keeps them well under PostgreSQL's 8000-byte NOTIFY payload on
the default layer.

The channel layer may drop a message, and it must never slow the job down: the
flusher thread only hands the message to a sender thread with its own event loop,
and a newer progress message for a job replaces one that is still waiting.

Message shapes (the `type` names the consumer handler, as Channels does):
    {"type": "job.progress", "job": 7, "seq_to": 1234}
    {"type": "job.status", "job": 7, "status": "succeeded", "last_seq": 1234}
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING, Any

from channels.layers import get_channel_layer

from occviz.jobs.recorder import Columns

if TYPE_CHECKING:
    from occviz.jobs.models import Job

logger = logging.getLogger(__name__)

# How long the runner waits, at a job's end, for its last messages to leave this process.
DRAIN_TIMEOUT_S = 2.0


def group_name(job_id: int) -> str:
    return f"job-{job_id}"


class _LayerSender:
    """One background event loop per process that sends to the channel layer, newest first-come.

    Layers hold connections bound to the event loop that opened them (channels-postgres
    keeps one pool per process), so every send from this process goes through one
    long-lived loop rather than a fresh `async_to_sync` loop per call.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str], dict[str, Any]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._sending: asyncio.Lock | None = None

    def send(self, group: str, message: dict[str, Any]) -> None:
        """Queue `message` for `group`; a progress message still waiting for this group is replaced."""
        loop = self._start()
        with self._lock:
            # dict order keeps a job's progress ahead of its status message
            self._pending[(group, message["type"])] = message
        loop.call_soon_threadsafe(self._poke)

    def drain(self, timeout: float = DRAIN_TIMEOUT_S) -> bool:
        """Send everything queued now; False if the layer did not take it within `timeout`."""
        loop = self._start()
        future = asyncio.run_coroutine_threadsafe(self._send_pending(), loop)
        try:
            future.result(timeout)
        except TimeoutError:
            future.cancel()
            return False
        return True

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                ready = threading.Event()
                thread = threading.Thread(target=self._run, args=(ready,), name="live-publisher", daemon=True)
                thread.start()
                ready.wait()
            assert self._loop is not None
            return self._loop

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._wake = asyncio.Event()
        self._sending = asyncio.Lock()
        self._loop = loop
        ready.set()
        loop.run_until_complete(self._serve())

    def _poke(self) -> None:
        assert self._wake is not None
        self._wake.set()

    async def _serve(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._send_pending()

    async def _send_pending(self) -> None:
        assert self._sending is not None
        async with self._sending:
            while True:
                with self._lock:
                    if not self._pending:
                        return
                    (group, _), message = next(iter(self._pending.items()))
                    del self._pending[(group, message["type"])]
                layer = get_channel_layer()
                if layer is None:
                    return
                try:
                    await layer.group_send(group, message)
                except Exception:
                    # Viewers poll the store when the layer is silent: a lost message only costs latency.
                    logger.warning("live: could not publish %s to %s", message["type"], group, exc_info=True)


_sender = _LayerSender()


class JobPublisher:
    """Job observer: after each stored batch, one `job.progress` message to the job's group; at the end, its status."""

    def __init__(self, job: Job) -> None:
        self.job_id = job.pk
        self.group = group_name(job.pk)

    def stored(self, seq_from: int, seq_to: int, columns: Columns) -> None:
        _sender.send(self.group, {"type": "job.progress", "job": self.job_id, "seq_to": seq_to})

    def ended(self, job: Job) -> None:
        publish_status(job, job.last_seq)


def publish_status(job: Job, last_seq: int) -> None:
    """Tell the job's viewers its lifecycle moved (above all: that it ended), and wait until that left."""
    _sender.send(group_name(job.pk), {"type": "job.status", "job": job.pk, "status": job.status, "last_seq": last_seq})
    if not _sender.drain():
        logger.warning("live: job %s status message not delivered; viewers will see it by polling", job.pk)
