"""`?watch=1`: the changes to a kind's objects, streamed as JSON lines as the API server streams them.

Each line is `{"type": "ADDED"|"MODIFIED"|"DELETED", "object": {...}}`. The objects are
polled every POLL_SECONDS, comparing each object's resourceVersion with the last one it
sent, so a job writing thousands of times a second sends each changed object once a poll,
with its latest state, rather than a line per write. Without a resourceVersion (or with
"0") every existing object first comes as ADDED; with one from a list, only what changes
after. Versions here are per object, so a single-object watch (fieldSelector
metadata.name=...) also sends a change the object had between the list and the watch.

A class watches the same few objects at once (`kubectl get leases -w` by every student),
so the watches of one query share one poll (`SharedPoll`): it reads the versions, fetches
only the objects whose version moved, and hands every watch the same objects. A watch then
costs no query of its own, and holds no thread and no database connection while it waits:
the poll borrows a connection from the web server's pool for each read and gives it back
(occviz/connections.py), and the request's own connection goes back when the stream starts.
Before, each watch polled on a thread of its own with a connection of its own: 200 watches
held 207 connections and slowed the home page tenfold (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.core.exceptions import EmptyResultSet
from django.db import DatabaseError, InterfaceError, close_old_connections
from django.http import HttpRequest, StreamingHttpResponse

from occviz.api import resources, tables
from occviz.api.kinds import Kind
from occviz.api.status import ApiError

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.1
DEFAULT_TIMEOUT_SECONDS = 1800
MAX_TIMEOUT_SECONDS = 3600

Objects = dict[int, tuple[int, dict[str, Any]]]
"""A poll's result: each object's pk, its resourceVersion and its JSON."""


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


class SharedPoll:
    """The objects of one query, read every POLL_SECONDS for as long as a watch of it is open.

    `objects` is replaced (never changed in place) by each poll that finds a change;
    `polls` counts the polls finished. A watch waits on `finished`, which each poll sets
    and replaces.
    """

    def __init__(self, kind: Kind, queryset: Any, key: tuple[Any, ...]) -> None:
        self.kind = kind
        self.queryset = queryset
        self.key = key
        self.watches = 0
        self.polls = 0
        self.objects: Objects = {}
        self.finished = asyncio.Event()
        self.broken: BaseException | None = None
        self._failing = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        # A context of its own: the poll outlives the request that started it.
        self._task = asyncio.get_running_loop().create_task(self._run(), context=contextvars.Context())

    async def next(self, after: int, deadline: float) -> bool:
        """Wait for a poll after the `after`-th; False if the `deadline` (time.monotonic()) came first."""
        while self.polls <= after:
            if self.broken is not None:
                raise RuntimeError(f"the watch's poll of {self.kind.kind} stopped") from self.broken
            try:
                await asyncio.wait_for(self.finished.wait(), deadline - time.monotonic())
            except TimeoutError:
                return False
        return True

    async def _run(self) -> None:
        try:
            await self._poll()
        except Exception as error:
            # Every watch of it ends with the error; the next watch of the query starts a new poll.
            self.broken = error
            _polls.pop(self.key, None)
            self.finished.set()
            raise

    async def _poll(self) -> None:
        while self.watches:
            try:
                objects = await database_sync_to_async(self._read, thread_sensitive=False)(self.objects)
            except (DatabaseError, InterfaceError) as error:
                # PostgreSQL restarting, say: the watches wait, and get the changes once it answers again.
                if not self._failing:
                    logger.warning("watch: reading %s failed, trying again every poll: %s", self.kind.kind, error)
                self._failing = True
            else:
                self._failing = False
                self.objects = objects
                self.polls += 1
                finished, self.finished = self.finished, asyncio.Event()
                finished.set()
            await asyncio.sleep(POLL_SECONDS)

    def _read(self, known: Objects) -> Objects:
        """The objects now, fetching only those whose version is not the one in `known` (`known` if none moved)."""
        versions = dict(self.queryset.values_list("pk", "resource_version"))
        moved = [pk for pk, version in versions.items() if pk not in known or known[pk][0] != version]
        if not moved and len(versions) == len(known):
            return known
        fetched = {obj.pk: self.kind.to_json(obj) for obj in self.queryset.filter(pk__in=moved)} if moved else {}
        objects: Objects = {}
        for pk in versions:  # one deleted between the two reads is left out: the next poll says so
            if pk in fetched:
                objects[pk] = (int(fetched[pk]["metadata"]["resourceVersion"]), fetched[pk])
            elif pk not in moved:
                objects[pk] = known[pk]
        return objects


_polls: dict[tuple[Any, ...], SharedPoll] = {}


def _join(kind: Kind, queryset: Any) -> SharedPoll:
    """The poll of this query on this event loop, started if no watch has it yet."""
    try:
        query = str(queryset.query)
    except EmptyResultSet:  # a selector nothing can match
        query = ""
    key = (asyncio.get_running_loop(), kind.kind, query)
    poll = _polls.get(key)
    if poll is None:
        poll = _polls[key] = SharedPoll(kind, queryset, key)
        poll.watches = 1
        poll.start()
    else:
        poll.watches += 1
    return poll


def _leave(poll: SharedPoll) -> None:
    poll.watches -= 1
    if not poll.watches and _polls.get(poll.key) is poll:
        del _polls[poll.key]  # its task ends after its current poll; a new watch starts another


async def _lines(
    kind: Kind, queryset: Any, since: int | None, single: bool, timeout: float, as_table: bool
) -> AsyncIterator[str]:
    def _line(event: str, obj: dict[str, Any]) -> str:
        # As a table (kubectl get -w), each event's object is a Table of its one row.
        shown = tables.table(kind, [obj], obj["metadata"]["resourceVersion"]) if as_table else obj
        return json.dumps({"type": event, "object": shown}) + "\n"

    deadline = time.monotonic() + timeout
    # The request's connection (its caller's token was read on it) goes back to the pool while the stream lasts.
    await sync_to_async(close_old_connections)()
    poll = _join(kind, queryset)
    try:
        # What the watch starts from: a poll that began after it joined (not one already under way), so
        # that it misses no change made before its request.
        if not await poll.next(poll.polls + 1 if poll.watches > 1 else 0, deadline):
            return
        objects = poll.objects
        # Daphne (Twisted) sends the headers with the first write, and a client waits for them: once they
        # are out, whatever it changes comes after what the watch starts from.
        yield ""
        sent: dict[int, int] = {}
        last: dict[int, dict[str, Any]] = {}
        if since is not None:
            # From a list's resourceVersion: what is there now was seen, except a single object that moved past it.
            sent = {pk: version for pk, (version, _) in objects.items() if not (single and version > since)}
            last = {pk: obj for pk, (_, obj) in objects.items()}
        seen = None
        while True:
            if objects is not seen:
                seen = objects
                for pk, (version, obj) in objects.items():
                    if sent.get(pk) != version:
                        event = "MODIFIED" if pk in sent or pk in last else "ADDED"
                        sent[pk] = version
                        last[pk] = obj
                        yield _line(event, obj)
                for pk in [pk for pk in last if pk not in objects]:
                    sent.pop(pk, None)
                    yield _line("DELETED", last.pop(pk))
            if not await poll.next(poll.polls, deadline):
                return
            objects = poll.objects
    finally:
        _leave(poll)
