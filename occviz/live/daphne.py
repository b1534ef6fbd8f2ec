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
- Autobahn's debug lines are not coloured: it builds their arguments for every frame it
  sends, whether debug logging is on or not, and colouring them (click's `style`, several
  times a frame) was a few per cent of the server's time with hundreds of sockets open.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

logger = logging.getLogger(__name__)


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

    factory_init = WebSocketFactory.__init__

    def factory_init_failing_with_a_close(self: Any, *args: Any, **kwargs: Any) -> None:
        factory_init(self, *args, **kwargs)
        self.setProtocolOptions(failByDrop=False)

    with contextlib.suppress(ImportError):
        import autobahn.util

        autobahn.util._HAS_CLICK = False

    WebSocketProtocol.handle_reply = handle_reply_as_occviz
    WebSocketFactory.__init__ = factory_init_failing_with_a_close
    WebSocketProtocol._occviz_patched = True
