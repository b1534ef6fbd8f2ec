"""The live app: frames, the per-process job feeds and the websocket consumers."""

from __future__ import annotations

from django.apps import AppConfig


class LiveConfig(AppConfig):
    name = "occviz.live"
    label = "live"
    verbose_name = "Live event stream"
