"""A student page's socket, `/ws/s/<token>/events/`: the job page's stream, opened by a student token.

It is JobEventsConsumer in every respect but who may open it: the token names the job (never
the path, never a session user), and an altered, revoked or expired token is closed with 4403.
The token is checked again while the socket is open, every RECHECK_S, so a link revoked or
expired during the lesson closes its students' sockets too. The sockets of one web process
that opened the same link share those reads (`_LinkChecks`): a class on one link costs one
read a second at most, not one a socket.

A seated student presses +1 over the same socket: `{"type": "press", "id": N}` (the id is the
page's, optional) is answered `{"type": "pressed", "id": N, "status": ..., "ok": ..., "message":
..., "version": ...}`, exactly what `POST /s/<token>/press/` answers, the student named by the
seat cookie the socket was opened with. It costs the web server no request: the socket is open
already. At most MAX_PRESSES_PER_S presses are in flight on one socket; more are refused at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from occviz.live.consumers import JobEventsConsumer
from occviz.live.dbthreads import read_for_handshake, run_for_socket
from occviz.students.presses import MAX_PRESSES_PER_S, TOO_FAST, Pressed, Read, read_for_seat
from occviz.students.tokens import LinkRefused, open_link

CLOSE_LINK_REFUSED = 4403


def _job_of_token(token: str) -> int | LinkRefused:
    try:
        return open_link(token).job_id
    except LinkRefused as refused:
        return refused


class _LinkChecks:
    """The latest read of each link, shared by this process's sockets: read again once FRESH_S old.

    Sockets asking while a read is under way wait for that read rather than start their own.
    """

    FRESH_S = 1.0

    def __init__(self) -> None:
        self._latest: dict[str, tuple[float, asyncio.Future[int | LinkRefused]]] = {}

    async def job_of(self, token: str) -> int | LinkRefused:
        now = time.monotonic()
        loop = asyncio.get_running_loop()
        found = self._latest.get(token)
        if found is None or now - found[0] > self.FRESH_S or found[1].get_loop() is not loop:
            # Only the links read within FRESH_S are kept: the few a process's classes are on.
            self._latest = {key: kept for key, kept in self._latest.items() if now - kept[0] <= self.FRESH_S}
            found = self._latest[token] = (now, asyncio.ensure_future(read_for_handshake(_job_of_token, token)))
        # Shielded: a socket closing while it waits does not cancel the read the others wait for.
        return await asyncio.shield(found[1])


_link_checks = _LinkChecks()


def _id_of(value: Any) -> int | None:
    """A press's id from JSON: a whole number (not a string, not a boolean) the page counts with."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53:
        return value
    return None


class StudentEventsConsumer(JobEventsConsumer):
    RECHECK_S = 10.0
    _recheck: asyncio.Task[None] | None = None
    _pressing: set[asyncio.Task[None]] | None = None

    @property
    def token(self) -> str:
        return str(self.scope["url_route"]["kwargs"]["token"])

    async def job_to_follow(self) -> int | None:
        found = await read_for_handshake(_job_of_token, self.token)
        if isinstance(found, LinkRefused):
            await self.refuse(CLOSE_LINK_REFUSED, found.reason)
            return None
        self._recheck = asyncio.create_task(self._recheck_link())
        return found

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not (isinstance(content, dict) and content.get("type") == "press"):
            await super().receive_json(content, **kwargs)
            return
        press_id = _id_of(content.get("id", 0))
        if press_id is None or set(content) - {"type", "id"}:
            await self.error('press takes "id": a whole number >= 0 (optional), and nothing else')
            return
        pressing = self._pressing = self._pressing or set()
        if len(pressing) >= MAX_PRESSES_PER_S:
            await self._answer(press_id, TOO_FAST)
            return
        task = asyncio.create_task(self._press(press_id))
        pressing.add(task)
        task.add_done_callback(pressing.discard)

    async def _press(self, press_id: int) -> None:
        """Read, think (awaited here, holding no thread), write: as the press endpoint does."""
        read = await run_for_socket(read_for_seat, self.token, self.scope.get("cookies", {}))
        if isinstance(read, Read):
            await asyncio.sleep(read.think_s)
            read = await run_for_socket(read.write)
        await self._answer(press_id, read)

    async def _answer(self, press_id: int, pressed: Pressed) -> None:
        await self.send_json({"type": "pressed", "id": press_id, **pressed.as_json()})

    async def _recheck_link(self) -> None:
        """Close with 4403 once the link is revoked or expires (or its job is deleted)."""
        while True:
            await asyncio.sleep(self.RECHECK_S)
            found = await _link_checks.job_of(self.token)
            if isinstance(found, LinkRefused):
                await self.stop_following()
                await self.refuse(CLOSE_LINK_REFUSED, found.reason)
                return

    async def disconnect(self, code: int) -> None:
        for task in list(self._pressing or ()):
            task.cancel()  # a press not yet written writes nothing: nobody is left to tell
        if self._recheck is not None:
            task, self._recheck = self._recheck, None
            if task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await super().disconnect(code)
