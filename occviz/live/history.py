"""Pages of a job's history, read once for all the viewers of this process that need them.

A class arriving opens the same job from seq 0, all at once: each viewer reads the same pages
(2000 events from 0, from 2000, ...) before it reaches the feed's window. Read one viewer at a
time, 200 viewers cost 200 reads of every page. Here a page is read once: viewers that ask for
the same one while it is being read wait for that read, and the last PAGES pages stay in memory
for the viewers that come after. A page is keyed by job, first sequence number and how far it
reaches, so a viewer is always sent exactly the range it asked for. Stored events never change
(a job only appends), so a kept page is never stale.

A read runs in the history threads (occviz/live/dbthreads.py); when every viewer waiting for it
has left, it is cancelled. The pages are dropped when the process's last socket closes.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict

from occviz.live.dbthreads import read_history
from occviz.live.frames import MAX_EVENTS_PER_FRAME, JobInfo, StoreReader, WireFrame
from occviz.live.memory import open_sockets

# Pages kept (about 150 kB each): enough for the first pages of a few jobs a class opens.
PAGES = 64

Key = tuple[int, int, int]


def _read_page(job: JobInfo, after: int, reach: int) -> WireFrame | None:
    return StoreReader(job, after).next_wire_frame(reach)


class _Reading:
    def __init__(self, task: asyncio.Future[WireFrame | None]) -> None:
        self.task = task
        self.waiting = 0


class HistoryPages:
    def __init__(self, size: int = PAGES) -> None:
        self.size = size
        self._pages: OrderedDict[Key, WireFrame] = OrderedDict()
        self._reading: dict[Key, _Reading] = {}

    async def page(self, job: JobInfo, after: int, upto: int) -> WireFrame | None:
        """The frame of the events after `after` up to `upto` (at most MAX_EVENTS_PER_FRAME), None if none."""
        if upto <= after:
            return None
        key = (job.id, after, min(upto, after + MAX_EVENTS_PER_FRAME))
        page = self._pages.get(key)
        if page is not None:
            self._pages.move_to_end(key)
            return page
        reading = self._reading.get(key)
        if reading is None:
            reading = self._reading[key] = _Reading(asyncio.ensure_future(read_history(_read_page, job, after, key[2])))
            reading.task.add_done_callback(lambda task: self._read(key, task))
        reading.waiting += 1
        try:
            return await asyncio.shield(reading.task)
        except asyncio.CancelledError:
            reading.waiting -= 1
            if reading.waiting == 0:
                reading.task.cancel()  # nobody wants it any more: stop the read
            raise

    def _read(self, key: Key, task: asyncio.Future[WireFrame | None]) -> None:
        if self._reading.get(key) is not None and self._reading[key].task is task:
            del self._reading[key]
        if task.cancelled() or task.exception() is not None:
            return
        page = task.result()
        if page is None:
            return
        self._pages[key] = page
        while len(self._pages) > self.size:
            self._pages.popitem(last=False)

    def clear(self) -> None:
        self._pages.clear()

    def __len__(self) -> int:
        return len(self._pages)


_pages: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HistoryPages] = weakref.WeakKeyDictionary()


def history_pages() -> HistoryPages:
    """This process's pages (one set per event loop: a read's future belongs to its loop)."""
    return _pages.setdefault(asyncio.get_running_loop(), HistoryPages())


def _clear() -> None:
    history_pages().clear()


open_sockets.on_idle.append(_clear)
