"""The signed-in user of a new socket, read in the handshake threads, not in the thread every socket shares.

Channels' AuthMiddleware loads the session and its user through `database_sync_to_async`,
in the one thread all of this process's websockets share (occviz/live/dbthreads.py says
why that wedged handshakes); this one does the same reads in the handshake threads.
"""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddleware, get_user
from channels.sessions import CookieMiddleware, SessionMiddleware

from occviz.live.dbthreads import read_for_handshake


class HandshakeAuthMiddleware(AuthMiddleware):
    async def resolve_scope(self, scope: dict[str, Any]) -> None:
        scope["user"]._wrapped = await read_for_handshake(get_user.func, scope)


def auth_middleware_stack(inner: Any) -> Any:
    """Channels' AuthMiddlewareStack, its user read in the handshake threads."""
    return CookieMiddleware(SessionMiddleware(HandshakeAuthMiddleware(inner)))
