"""The channel layer: channels-postgres, made to outlive a PostgreSQL restart.

channels-postgres brings messages into this process through one connection that LISTENs
for the NOTIFY its message table's trigger sends. When PostgreSQL restarts, that
connection breaks: the package's listener task ends with the error and is never started
again (its "running" flag stays set), so no message reaches this process any more and
every live job falls back to its feed's poll, one read a second, until the web server is
restarted. Its pool's connections broke too, and each handed its error to the next caller,
once: a socket opened then lost its feed's group, or its stream.

`ReconnectingPostgresChannelLayer` keeps the package's protocol and changes three things:

- its listener reconnects by itself, at once and then backing off to RETRY_MAX_S while
  PostgreSQL is away. It does not replay the messages stored meanwhile (the package does so
  only at its first start): their NOTIFY was lost, and a feed's poll already reads what a
  lost message would have announced;
- its pool checks a connection before handing it out (one round trip), so a broken one is
  replaced, not used; and the first broken one has every idle connection checked at once,
  since they all broke together (else the pool would find them one by one, waiting 1, 2,
  4 s in between: seconds of silence after PostgreSQL is back);
- one listener per event loop: the package starts one for every receive that comes before
  the first listener is up (a socket's first receives come in twos), each delivering every
  message again, and each reconnecting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import channels_postgres.db
import psycopg
from channels_postgres.core import PostgresChannelLayer
from psycopg_pool import AsyncConnectionPool

logger = logging.getLogger(__name__)

# The listener's pauses between attempts to reconnect: from RETRY_FIRST_S, doubling, at most RETRY_MAX_S.
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 2.0
# The package's NOTIFY channel, and what its flush sends to stop a listener.
_CHANNEL = "channels_postgres_messages"
_SHUTDOWN = "1:shutdown"


class ReconnectingPostgresChannelLayer(PostgresChannelLayer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.django_db.psycopg_options = {"check": _check_connection, **self.django_db.psycopg_options}
        self._listener_loop: asyncio.AbstractEventLoop | None = None

    def _get_or_create_listener_task(self) -> tuple[asyncio.Event, bool]:
        """The package's answer (the listener's "running" event, whether to start one), but one listener per loop."""
        running, start = super()._get_or_create_listener_task()
        loop = asyncio.get_running_loop()
        if start and self._listener_loop is loop:
            return running, False  # started, not yet listening
        if start:
            self._listener_loop = loop  # the caller starts it now
        return running, start

    async def listen_to_all_channels(self) -> None:
        """The package's listener first; whenever its connection breaks, LISTEN again on a new one, until shut down."""
        try:
            await self._listen_and_reconnect()
        finally:
            self._listener_loop = None

    async def _listen_and_reconnect(self) -> None:
        try:
            await super().listen_to_all_channels()
            return
        except (psycopg.Error, OSError) as error:
            logger.warning("channel layer: its listener lost PostgreSQL (%s): reconnecting", error)
        lost, pause = time.monotonic(), RETRY_FIRST_S
        conninfo = psycopg.conninfo.make_conninfo(conninfo="", **self.db_params)
        while True:
            await asyncio.sleep(pause)
            listening = False
            try:
                async with await psycopg.AsyncConnection.connect(conninfo=conninfo, autocommit=True) as connection:
                    await connection.execute(f"LISTEN {_CHANNEL}")
                    listening = True
                    logger.warning(
                        "channel layer: listening again, %.1f s after losing PostgreSQL", time.monotonic() - lost
                    )
                    if await self._deliver(connection):
                        return
            except (psycopg.Error, OSError) as error:
                if listening:
                    logger.warning("channel layer: its listener lost PostgreSQL (%s): reconnecting", error)
            if listening:
                lost, pause = time.monotonic(), RETRY_FIRST_S
            else:
                pause = min(pause * 2, RETRY_MAX_S)

    async def _deliver(self, connection: psycopg.AsyncConnection[Any]) -> bool:
        """Queue each message for its channel, as the package does; True once told to shut down."""
        async for event in connection.notifies():
            if event.payload == _SHUTDOWN:
                self.listener_task_is_running.clear()
                return True
            channel = event.payload.split(":")[1]
            # As the package does: only the process holding a channel's advisory lock takes its messages.
            if self._channel_advisory_locks.get(channel, False):
                self._get_or_create_queue(channel).put_nowait(event.payload)
        return False


async def _check_connection(connection: psycopg.AsyncConnection[Any]) -> None:
    """The pool's check of a connection it is about to hand out; a broken one has the whole pool checked first."""
    try:
        await AsyncConnectionPool.check_connection(connection)
    except psycopg.Error:
        pool = channels_postgres.db.connection_pool  # the package's one pool per process
        if pool is not None:
            await pool.check()
        raise
