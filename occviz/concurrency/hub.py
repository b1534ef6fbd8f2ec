"""Many actors on one thread: each a greenlet, switched whenever it waits on PostgreSQL or sleeps.

A job's writers as threads of one process pay for every statement twice over: the thread
gives up the interpreter lock before it waits and takes it back after, and each handover
is a futex call and a context switch. With sixteen writers that bookkeeping, not Python
and not PostgreSQL, was most of the process's CPU (`perf`: 58 % in the kernel, mostly
futex waits and the scheduler), and on a two-core machine that CPU is taken from the
database the writers race on. On a hub the writers are greenlets of one thread: a
writer sends its statement without blocking (libpq's nonblocking mode, through its
`PreparedSession`), then switches to the hub, which waits on every writer's socket at
once with one `epoll` and switches back to whichever answered. Nothing else changes: the
actors are the same functions, calling the same session and `pause`.

    hub = Hub(stop)
    hub.run([actor_a, actor_b], ready=barrier.wait)   # returns when all have returned

Inside a hub's actor, `current_hub()` is the hub: `PreparedSession` and `ActorContext`
find it there. `hub.gather()` is the actors' barrier: once every actor still running has
reached it, the hub calls `ready` (the job's own barrier) and releases them all, or throws
what `ready` raised into each.
"""

from __future__ import annotations

import heapq
import itertools
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from greenlet import getcurrent, greenlet

_local = threading.local()

# How long the hub waits at most before it looks at the stop signal again: sleepers wake on a stop.
STOP_POLL_S = 0.02

_START = object()


def current_hub() -> Hub | None:
    """The hub this thread runs, or None for a thread of its own."""
    return getattr(_local, "hub", None)


class Hub:
    """One thread's loop of greenlets, each waiting for a socket, a timer or the others at the barrier."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self._loop: greenlet | None = None
        self._poll = select.epoll()
        self._registered: set[int] = set()
        self._waiting: dict[int, greenlet] = {}
        self._timers: list[tuple[float, int, greenlet]] = []
        self._order = itertools.count()
        self._ready: deque[tuple[greenlet, object]] = deque()
        self._gathered: list[greenlet] = []

    # -- what an actor calls -------------------------------------------------------------

    def wait_fd(self, fd: int, *, writable: bool = False) -> None:
        """Switch away until socket `fd` can be read (or written)."""
        mask = (select.EPOLLOUT if writable else select.EPOLLIN) | select.EPOLLONESHOT
        if fd in self._registered:
            self._poll.modify(fd, mask)
        else:
            self._poll.register(fd, mask)
            self._registered.add(fd)
        self._waiting[fd] = getcurrent()
        self._switch()

    def forget_fd(self, fd: int) -> None:
        """Before a socket closes: its number may come back as another's."""
        if fd in self._registered:
            self._registered.discard(fd)
            self._poll.unregister(fd)

    def wait(self, timeout: float | None = None) -> bool:
        """`threading.Event.wait` for the hub's stop signal: True if it is set, else False after `timeout`."""
        if self.stop.is_set():
            return True
        if timeout is not None and timeout <= 0:
            return False
        deadline = time.perf_counter() + (timeout if timeout is not None else 1e9)
        heapq.heappush(self._timers, (deadline, next(self._order), getcurrent()))
        return bool(self._switch())

    def gather(self) -> None:
        """The actors' barrier: returns once every running actor has come here and the hub's `ready` returned."""
        self._gathered.append(getcurrent())
        self._switch()

    def _switch(self) -> object:
        assert self._loop is not None, "not on a hub"
        outcome = self._loop.switch()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    # -- the loop ----------------------------------------------------------------------------

    def run(self, actors: Sequence[Callable[[], object]], ready: Callable[[], object] = lambda: None) -> None:
        """Run `actors` as greenlets of this thread until every one has returned.

        The actors catch their own errors: one that escapes ends the hub's thread with it.
        """
        _local.hub = self
        self._loop = getcurrent()
        running = [greenlet(actor, parent=self._loop) for actor in actors]
        self._ready.extend((actor, _START) for actor in running)
        alive = len(running)
        try:
            while alive:
                while self._ready:
                    actor, value = self._ready.popleft()
                    if value is _START:
                        actor.switch()
                    else:
                        actor.switch(value)
                    if actor.dead:
                        alive -= 1
                if not alive:
                    break
                if self._gathered and len(self._gathered) == alive:
                    self._release(ready)
                    continue
                self._wait_for_any()
        finally:
            _local.hub = None
            self._poll.close()

    def _release(self, ready: Callable[[], object]) -> None:
        """Every running actor is at the barrier: the job's `ready` now, then all of them on."""
        gathered, self._gathered = self._gathered, []
        try:
            ready()
        except BaseException as refused:
            self._ready.extend((actor, refused) for actor in gathered)
        else:
            self._ready.extend((actor, None) for actor in gathered)

    def _wait_for_any(self) -> None:
        now = time.perf_counter()
        timeout = STOP_POLL_S
        if self._timers:
            timeout = max(0.0, min(timeout, self._timers[0][0] - now))
        for fd, _ in self._poll.poll(timeout):
            actor = self._waiting.pop(fd, None)
            if actor is not None:
                self._ready.append((actor, None))
        if self.stop.is_set():
            # Sleepers wake at once, told the job stopped; a statement under way still ends on its own.
            self._ready.extend((actor, True) for _, _, actor in self._timers)
            self._timers.clear()
            return
        now = time.perf_counter()
        while self._timers and self._timers[0][0] <= now:
            _, _, actor = heapq.heappop(self._timers)
            self._ready.append((actor, False))


__all__ = ["Hub", "current_hub"]
