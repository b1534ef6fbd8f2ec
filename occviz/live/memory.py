"""Giving memory back once the viewers have left.

A class arriving makes the web process hold many frames' texts at once (each socket's
messages, pages of history, the page's fragments). Once freed, Python hands the large
ones back to glibc, which keeps them in its arenas (one per thread that allocated: the
event loop's and each database thread's) rather than returning them to the system, so
the process stayed at its peak long after everyone had left. When the last socket of the
process closes, `release_freed_memory` collects what cycles hold and asks glibc to give
back its free pages (malloc_trim), after a short wait so that a page being reloaded does
not pay for it.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
from collections.abc import Callable

RELEASE_AFTER_S = 1.0


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_trim = _malloc_trim()


def release_freed_memory() -> None:
    gc.collect()
    if _trim is not None:
        _trim(0)


class OpenSockets:
    """Counts this process's open job sockets; memory is released once the count stays at zero."""

    def __init__(self) -> None:
        self.count = 0
        self._pending: asyncio.TimerHandle | None = None
        self.on_idle: list[Callable[[], None]] = []
        """What lets go of what it keeps for viewers (kept pages), before the memory is released."""

    def opened(self) -> None:
        self.count += 1
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None

    def closed(self) -> None:
        self.count -= 1
        if self.count == 0 and self._pending is None:
            self._pending = asyncio.get_running_loop().call_later(RELEASE_AFTER_S, self._release)

    def _release(self) -> None:
        self._pending = None
        if self.count == 0:
            for let_go in self.on_idle:
                let_go()
            release_freed_memory()


open_sockets = OpenSockets()
