"""Pages of a job's history, read once for all the viewers of this process that need them.

A class arriving opens the same job from seq 0, all at once: each viewer reads the same pages
(2000 events from 0, from 2000, ...) before it reaches the feed's window. Read one viewer at a
time, 200 viewers cost 200 reads of every page. Here a page is read once: viewers that ask for
the same one while it is being read wait for that read, and the last PAGES pages stay in memory
for the viewers that come after. A page is keyed by job, first sequence number and how far it
reaches, so a viewer is always sent exactly the range it asked for. Stored events never change
(a job only appends), so a kept page is never stale.

The same goes for the page's fragments as of the end of a viewer's first page (`fragments_at`):
a class reopening a job from seq 0 would otherwise render them once a socket, hundreds of times.

A read runs in the history threads (occviz/live/dbthreads.py); when every viewer waiting for it
has left, it is cancelled. What is kept is dropped when the process's last socket closes.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from occviz.live import fragments
from occviz.live.dbthreads import read_history
from occviz.live.frames import MAX_EVENTS_PER_FRAME, JobInfo, StoreReader, WireFrame
from occviz.live.jobstate import JobState
from occviz.live.memory import open_sockets

# Pages kept (about 150 kB each): enough for the first pages of a few jobs a class opens.
PAGES = 64

Key = tuple[int, int, int]


def _read_page(job: JobInfo, after: int, reach: int) -> WireFrame | None:
    return StoreReader(job, after).next_frame(reach)


class _Reading[V]:
    def __init__(self, task: asyncio.Future[V | None]) -> None:
        self.task = task
        self.waiting = 0


class SharedReads[K, V]:
    """Reads that the viewers of this process share: one read for everyone who asks for a key while
    it runs, and the last `size` results kept for those who come after (a None result is not kept).

    A read whose viewers have all left is cancelled. Keep only what never changes under its key.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._kept: OrderedDict[K, V] = OrderedDict()
        self._reading: dict[K, _Reading[V]] = {}

    async def read(self, key: K, fn: Callable[..., V | None], *args: Any) -> V | None:
        """`fn(*args)`'s result, from the history threads, or as read already under `key`."""
        kept = self._kept.get(key)
        if kept is not None:
            self._kept.move_to_end(key)
            return kept
        reading = self._reading.get(key)
        if reading is None:
            reading = self._reading[key] = _Reading(asyncio.ensure_future(read_history(fn, *args)))
            reading.task.add_done_callback(lambda task: self._read(key, task))
        reading.waiting += 1
        try:
            return await asyncio.shield(reading.task)
        except asyncio.CancelledError:
            reading.waiting -= 1
            if reading.waiting == 0:
                reading.task.cancel()  # nobody wants it any more: stop the read
            raise

    def _read(self, key: K, task: asyncio.Future[V | None]) -> None:
        if self._reading.get(key) is not None and self._reading[key].task is task:
            del self._reading[key]
        if task.cancelled() or task.exception() is not None:
            return
        result = task.result()
        if result is None:
            return
        self._kept[key] = result
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    def clear(self) -> None:
        self._kept.clear()

    def __len__(self) -> int:
        return len(self._kept)


class HistoryPages(SharedReads[Key, WireFrame]):
    def __init__(self, size: int = PAGES) -> None:
        super().__init__(size)

    async def page(self, job: JobInfo, after: int, upto: int) -> WireFrame | None:
        """The frame of the events after `after` up to `upto` (at most MAX_EVENTS_PER_FRAME), None if none."""
        if upto <= after:
            return None
        key = (job.id, after, min(upto, after + MAX_EVENTS_PER_FRAME))
        return await self.read(key, _read_page, job, after, key[2])


# The page's fragments as of one event, kept for the sockets that catch up from the store: a class
# reopening a job from seq 0 asks for them as of the same first page, all at once.
FRAGMENTS = 32


def _fragments_at(state: JobState, seq: int) -> dict[str, str]:
    return fragments.render_parts(fragments.context_at(state, seq))


class _PerLoop:
    """This process's shared reads, one set per event loop: a read's future belongs to its loop."""

    def __init__(self) -> None:
        self.pages = HistoryPages()
        self.fragments: SharedReads[tuple[Any, ...], dict[str, str]] = SharedReads(FRAGMENTS)


_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _PerLoop] = weakref.WeakKeyDictionary()


def _this_loop() -> _PerLoop:
    return _loops.setdefault(asyncio.get_running_loop(), _PerLoop())


def history_pages() -> HistoryPages:
    """This process's pages."""
    return _this_loop().pages


async def fragments_at(state: JobState, seq: int) -> dict[str, str]:
    """The page's fragments as of event `seq`, rendered once for every socket that asks for them."""
    key = (state.info.id, seq, state.status, state.invariant_ok, state.error)
    parts = await _this_loop().fragments.read(key, _fragments_at, state, seq)
    assert parts is not None
    return parts


def _clear() -> None:
    reads = _this_loop()
    reads.pages.clear()
    reads.fragments.clear()


open_sockets.on_idle.append(_clear)
