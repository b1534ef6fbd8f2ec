"""`?watch=1`: the changes to a kind's objects, streamed as JSON lines as the API server streams them.

Each line is `{"type": "ADDED"|"MODIFIED"|"DELETED", "object": {...}}`. The stream polls the
table every POLL_SECONDS comparing each object's resourceVersion with the last one it sent,
so a job writing thousands of times a second sends each changed object once a poll, with
its latest state, rather than a line per write. Without a resourceVersion (or with "0")
every existing object first comes as ADDED; with one from a list, only what changes after.
Versions here are per object, so a single-object watch (fieldSelector metadata.name=...)
also sends a change the object had between the list and the watch.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, StreamingHttpResponse

from occviz.api import resources, tables
from occviz.api.kinds import Kind
from occviz.api.status import ApiError

POLL_SECONDS = 0.1
DEFAULT_TIMEOUT_SECONDS = 1800
MAX_TIMEOUT_SECONDS = 3600


def wants_watch(request: HttpRequest) -> bool:
    return request.GET.get("watch", "").lower() in ("1", "true")


def _timeout(request: HttpRequest) -> float:
    raw = request.GET.get("timeoutSeconds", "")
    if not raw:
        return DEFAULT_TIMEOUT_SECONDS
    if not (raw.isascii() and raw.isdigit()):
        raise ApiError(400, f'timeoutSeconds: Invalid value: "{raw[:40]}": must be a whole number of seconds')
    return min(int(raw), MAX_TIMEOUT_SECONDS)


def _since(request: HttpRequest) -> int | None:
    raw = request.GET.get("resourceVersion", "")
    if raw in ("", "0"):
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19:
        raise ApiError(400, f'resourceVersion: Invalid value: "{raw[:40]}": must be a resourceVersion from a list')
    return int(raw)


def watch_response(request: HttpRequest, kind: Kind, namespace: str | None) -> StreamingHttpResponse:
    """The streaming response for a watch request (its parameters checked now, before it starts)."""
    objects = resources.query(kind, namespace, request)
    single = "metadata.name" in resources.field_selector(request)
    lines = _lines(kind, objects, _since(request), single, _timeout(request), tables.wants_table(request))
    response = StreamingHttpResponse(lines, content_type="application/json")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def _versions(objects: Any) -> dict[int, int]:
    return dict(objects.values_list("pk", "resource_version"))


def _fetch(kind: Kind, objects: Any, pks: list[int]) -> dict[int, dict[str, Any]]:
    return {obj.pk: kind.to_json(obj) for obj in objects.filter(pk__in=pks)}


async def _lines(
    kind: Kind, objects: Any, since: int | None, single: bool, timeout: float, as_table: bool
) -> AsyncIterator[str]:
    def _line(event: str, obj: dict[str, Any]) -> str:
        # As a table (kubectl get -w), each event's object is a Table of its one row.
        shown = tables.table(kind, [obj], obj["metadata"]["resourceVersion"]) if as_table else obj
        return json.dumps({"type": event, "object": shown}) + "\n"

    deadline = time.monotonic() + timeout
    # Nothing yet, but Daphne (Twisted) sends the headers with the first write: a client waits for them.
    yield ""
    sent: dict[int, int] = {}
    last: dict[int, dict[str, Any]] = {}
    versions = await sync_to_async(_versions)(objects)
    if since is None:
        changed = list(versions)
    else:
        # From a list's resourceVersion: what is there now was seen, except a single object that moved past it.
        sent = dict(versions)
        last = await sync_to_async(_fetch)(kind, objects, list(versions))
        changed = [pk for pk, version in versions.items() if single and version > since]
    while True:
        if changed:
            fetched = await sync_to_async(_fetch)(kind, objects, changed)
            for pk in changed:
                if pk not in fetched:
                    continue  # deleted since the versions were read: the next poll says so
                event = "MODIFIED" if pk in sent else "ADDED"
                sent[pk] = int(fetched[pk]["metadata"]["resourceVersion"])
                last[pk] = fetched[pk]
                yield _line(event, fetched[pk])
        for pk in [pk for pk in sent if pk not in versions]:
            del sent[pk]
            gone = last.pop(pk, None)
            if gone is not None:
                yield _line("DELETED", gone)
        if time.monotonic() >= deadline:
            return
        await asyncio.sleep(POLL_SECONDS)
        versions = await sync_to_async(_versions)(objects)
        changed = [pk for pk, version in versions.items() if sent.get(pk) != version]
