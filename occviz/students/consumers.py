"""A student page's socket, `/ws/s/<token>/events/`: the job page's stream, opened by a student token.

It is JobEventsConsumer in every respect but who may open it: the token names the job (never
the path, never a session user), and an altered, revoked or expired token is closed with 4403.
"""

from __future__ import annotations

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
    async def job_to_follow(self) -> int | None:
        token = str(self.scope["url_route"]["kwargs"]["token"])
        found = await read_for_handshake(_job_of_token, token)
        if isinstance(found, LinkRefused):
            await self.refuse(CLOSE_LINK_REFUSED, found.reason)
            return None
        return found
