"""The live app: frames, the per-process job feeds and the websocket consumers."""

from __future__ import annotations

from django.apps import AppConfig


class LiveConfig(AppConfig):
    name = "occviz.live"
    label = "live"
    verbose_name = "Live event stream"

    def ready(self) -> None:
        # The runner knows no websocket: it is handed the publisher as an observer of every job.
        from occviz.jobs.registry import add_observer
        from occviz.live.publish import JobPublisher

        add_observer(JobPublisher)
