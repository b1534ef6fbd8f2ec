"""ASGI entry point: HTTP through Django, websockets through Channels (signed-in users, allowed origins)."""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings

from occviz.web.bad_requests import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "occviz.settings")
# Loaded before the settings, this is the web server: its connections come from a bounded pool (occviz/connections.py).
if not settings.configured:
    os.environ.setdefault("OCCVIZ_PROCESS", "web")
# Django must be set up before the consumers (and the models they import) are loaded.
django_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from occviz.live.routing import websocket_urlpatterns  # noqa: E402


def send_close_reasons_through_daphne() -> None:
    """Make Daphne put a websocket.close's reason in the close frame, not only its code.

    Daphne 4 passes only the code to Autobahn (django/daphne#374), so a client read an empty
    reason; Autobahn's sendClose takes both (and cuts a reason to the frame's 123 bytes).
    Daphne loads this module before it builds its protocols, so they all close this way.
    """
    try:
        from daphne.ws_protocol import WebSocketProtocol
    except ImportError:  # served by another ASGI server
        return
    handle_reply = WebSocketProtocol.handle_reply

    def handle_reply_with_reason(self: Any, message: dict[str, Any]) -> None:
        # Before the handshake completes a close is an HTTP 403 (Daphne's own path): no frame to carry a reason.
        if message.get("type") == "websocket.close" and message.get("reason") and self.state != self.STATE_CONNECTING:
            self.sendClose(code=message.get("code", 1000), reason=message["reason"])
        else:
            handle_reply(self, message)

    WebSocketProtocol.handle_reply = handle_reply_with_reason


send_close_reasons_through_daphne()

application = ProtocolTypeRouter(
    {
        "http": django_application,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
