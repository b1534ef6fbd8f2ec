"""A student page's socket, `/ws/s/<token>/events/`: the job page's stream, opened by a student token.

It is JobEventsConsumer in every respect but who may open it: the token names the job (never
the path, never a session user), and an altered, revoked or expired token is closed with 4403.
The token is checked again while the socket is open, every RECHECK_S, so a link revoked or
expired during the lesson closes its students' sockets too.
"""

from __future__ import annotations

import asyncio
import contextlib

from occviz.live.consumers import JobEventsConsumer
from occviz.live.dbthreads import read_for_handshake
from occviz.students.tokens import LinkRefused, open_link

CLOSE_LINK_REFUSED = 4403


def _job_of_token(token: str) -> int | LinkRefused:
    try:
        return open_link(token).job_id
    except LinkRefused as refused:
        return refused


class StudentEventsConsumer(JobEventsConsumer):
    RECHECK_S = 10.0
    _recheck: asyncio.Task[None] | None = None

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

    async def _recheck_link(self) -> None:
        """Close with 4403 once the link is revoked or expires (or its job is deleted)."""
        while True:
            await asyncio.sleep(self.RECHECK_S)
            found = await read_for_handshake(_job_of_token, self.token)
            if isinstance(found, LinkRefused):
                await self.stop_following()
                await self.refuse(CLOSE_LINK_REFUSED, found.reason)
                return

    async def disconnect(self, code: int) -> None:
        if self._recheck is not None:
            task, self._recheck = self._recheck, None
            if task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await super().disconnect(code)
