"""Websocket routes of the live stream (mounted by occviz/asgi.py)."""

from __future__ import annotations

from django.urls import path, re_path

from occviz.live.consumers import JobEventsConsumer, UnknownPathConsumer
from occviz.students.consumers import StudentEventsConsumer

websocket_urlpatterns = [
    path("ws/jobs/<int:job_id>/events/", JobEventsConsumer.as_asgi()),
    path("ws/s/<str:token>/events/", StudentEventsConsumer.as_asgi()),
    # Last, matching any path: without it an unknown path raises in the router, a 500 with a traceback.
    re_path(r"", UnknownPathConsumer.as_asgi()),
]
