"""Websocket routes of the live stream (mounted by occviz/asgi.py)."""

from __future__ import annotations

from django.urls import path

from occviz.live.consumers import JobEventsConsumer

websocket_urlpatterns = [
    path("ws/jobs/<int:job_id>/events/", JobEventsConsumer.as_asgi()),
]
