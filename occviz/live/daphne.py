"""What occviz changes in Daphne's websocket protocol, applied once when asgi.py is loaded.

Daphne loads the ASGI module before it builds its protocols, so every socket it serves
behaves this way:

- A close carries its reason in the close frame, not only its code (django/daphne#374:
  Daphne 4 passes only the code to Autobahn, whose sendClose takes both and cuts a reason
  to the frame's 123 bytes).
- A message sent after the socket began closing (the client went away while a frame was on
  its way from the application) is dropped: nobody can receive it. Autobahn raised
  "Attempt to send on a closed protocol" into the application, which logged a traceback.
- A client that breaks the protocol (a message over Daphne's 1 MB limit, say) gets a close
  frame with the code that says why (1009 for the size) instead of a dropped connection
  with none: Autobahn's `failByDrop`, off.
- A frame goes to the kernel as it is sent, when nothing waits before it on its connection.
  Twisted queues every write, asks the event loop to watch the socket (an epoll_ctl), writes
  on the loop's next turn and stops watching (another): three system calls and a turn of
  the loop for each frame to each socket, most of the server's time with a class on one job.
  A frame the kernel does not take whole (a slow reader) has its rest queued as before, and
  anything but a plain TCP connection (TLS) goes Twisted's way.
- A socket the server closes waits CLOSE_HANDSHAKE_TIMEOUT_S for the client's close frame, not
  Autobahn's 1 s: that second counts from when the close is queued behind the frames before it,
  so a reader slower than its stream had its connection reset before it had read them.
- Autobahn's debug lines are not coloured: it builds their arguments for every frame it
  sends, whether debug logging is on or not, and colouring them (click's `style`, several
  times a frame) was a few per cent of the server's time with hundreds of sockets open.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

logger = logging.getLogger(__name__)

# How long a socket the server closed waits for the client's close frame before the connection is
# dropped. Autobahn's 1 s counts from when the close is queued, not sent: a reader slower than a
# long history (a finished job read from seq 0 on a weak network) lost its tail to a reset.
CLOSE_HANDSHAKE_TIMEOUT_S = 30.0


def patch_daphne() -> None:
    try:
        from daphne.ws_protocol import WebSocketFactory, WebSocketProtocol
    except ImportError:  # served by another ASGI server
        return
    if getattr(WebSocketProtocol, "_occviz_patched", False):
        return
    handle_reply = WebSocketProtocol.handle_reply

    def handle_reply_as_occviz(self: Any, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "websocket.send" and self.state in (self.STATE_CLOSING, self.STATE_CLOSED):
            logger.debug("live: a message for %s after its socket began closing was dropped", self.client_addr)
            return
        # Before the handshake completes a close is an HTTP 403 (Daphne's own path): no frame to carry a reason.
        if kind == "websocket.close" and message.get("reason") and self.state != self.STATE_CONNECTING:
            self.sendClose(code=message.get("code", 1000), reason=message["reason"])
            return
        handle_reply(self, message)

    from twisted.internet.tcp import Connection

    def idle_tcp(transport: Any) -> bool:
        """Whether `transport` is a plain TCP connection, open, with nothing queued to write."""
        return (
            isinstance(transport, Connection)
            and not transport.TLS
            and bool(transport.connected)
            and not transport.disconnecting
            and not transport._writeDisconnected
            and not transport._tempDataBuffer
            and transport.offset == len(transport.dataBuffer)
        )

    send_data = WebSocketProtocol.sendData

    def send_data_now(self: Any, data: bytes, sync: bool = False, chopsize: int | None = None) -> None:
        transport = self.transport
        if sync or chopsize or self.send_queue or not idle_tcp(transport):
            send_data(self, data, sync, chopsize)
            return
        try:
            sent = transport.socket.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:  # the connection broke: Twisted's own write finds out, and closes it as it would have
            send_data(self, data)
            return
        if sent < len(data):
            send_data(self, data[sent:])
        elif self.state == self.STATE_OPEN:
            self.trafficStats.outgoingOctetsWireLevel += sent

    factory_init = WebSocketFactory.__init__

    def factory_init_failing_with_a_close(self: Any, *args: Any, **kwargs: Any) -> None:
        factory_init(self, *args, **kwargs)
        self.setProtocolOptions(failByDrop=False, closeHandshakeTimeout=CLOSE_HANDSHAKE_TIMEOUT_S)

    with contextlib.suppress(ImportError):
        import autobahn.util

        autobahn.util._HAS_CLICK = False

    WebSocketProtocol.handle_reply = handle_reply_as_occviz
    WebSocketProtocol.sendData = send_data_now
    WebSocketFactory.__init__ = factory_init_failing_with_a_close
    WebSocketProtocol._occviz_patched = True
