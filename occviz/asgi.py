"""ASGI entry point: HTTP through Django, websockets through Channels (signed-in users, the site's own origin)."""

from __future__ import annotations

import os

from django.conf import settings

from occviz.web.bad_requests import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "occviz.settings")
# Loaded before the settings, this is the web server: its connections come from a bounded pool (occviz/connections.py).
if not settings.configured:
    os.environ.setdefault("OCCVIZ_PROCESS", "web")
# Django must be set up before the consumers (and the models they import) are loaded.
django_application = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from occviz.live.auth import auth_middleware_stack  # noqa: E402
from occviz.live.daphne import patch_daphne  # noqa: E402
from occviz.live.origin import SameOriginValidator  # noqa: E402
from occviz.live.routing import websocket_urlpatterns  # noqa: E402

patch_daphne()

application = ProtocolTypeRouter(
    {
        "http": django_application,
        "websocket": SameOriginValidator(auth_middleware_stack(URLRouter(websocket_urlpatterns))),
    }
)
