"""`?watch=1` over real HTTP: ADDED, MODIFIED and DELETED lines arrive while another writer writes."""

from __future__ import annotations

import http.client
import json
import queue
import socket
import threading
import time
from typing import Any
from urllib.parse import urlencode, urlsplit

import requests

from occviz.store import writes
from occviz.store.cas import ANY
from occviz.store.models import Counter
from tests.api.conftest import COUNTERS, LEASES, lease_body
from tests.api.test_resources import url


class Watch:
    """A watch request read line by line in a thread, its events handed over through a queue.

    On a plain socket (http.client), so that closing it is immediate, as a client going away is.
    """

    def __init__(self, api: requests.Session, path: str, **params: Any) -> None:
        parts = urlsplit(api.base)  # type: ignore[attr-defined]
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        query = urlencode({"watch": "true", **params})
        self.connection.request("GET", f"{path}?{query}", headers={"Authorization": api.headers["Authorization"]})
        self.response = self.connection.getresponse()
        assert self.response.status == 200, self.response.read()
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            while line := self.response.readline():
                if line.strip():
                    self.events.put(json.loads(line))
        except Exception:  # the socket closed under the read (close()): the watch is over
            pass

    def next(self, timeout: float = 10.0) -> dict[str, Any]:
        return self.events.get(timeout=timeout)

    def close(self) -> None:
        sock = self.connection.sock
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
        self.connection.close()


def test_watch_streams_added_modified_and_deleted_as_they_happen(api: requests.Session) -> None:
    api.post(url(api, LEASES), json=lease_body("old"))
    watch = Watch(api, LEASES)
    try:
        first = watch.next()
        assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "old")
        api.post(url(api, LEASES), json=lease_body("demo"))
        added = watch.next()
        assert (added["type"], added["object"]["metadata"]["name"]) == ("ADDED", "demo")
        api.put(url(api, f"{LEASES}/demo"), json=lease_body("demo", holderIdentity="b"))
        modified = watch.next()
        assert modified["type"] == "MODIFIED" and modified["object"]["spec"]["holderIdentity"] == "b"
        assert modified["object"]["metadata"]["resourceVersion"] == "2"
        api.delete(url(api, f"{LEASES}/demo"))
        deleted = watch.next()
        assert (deleted["type"], deleted["object"]["metadata"]["name"]) == ("DELETED", "demo")
    finally:
        watch.close()


def test_watch_from_a_lists_version_sends_only_later_changes_of_the_named_object(api: requests.Session) -> None:
    api.post(url(api, LEASES), json=lease_body("demo"))
    api.post(url(api, LEASES), json=lease_body("other"))
    listed = api.get(url(api, LEASES), params={"fieldSelector": "metadata.name=demo"}).json()
    assert [item["metadata"]["name"] for item in listed["items"]] == ["demo"]
    watch = Watch(
        api, LEASES, resourceVersion=listed["metadata"]["resourceVersion"], fieldSelector="metadata.name=demo"
    )
    try:
        api.put(url(api, f"{LEASES}/other"), json=lease_body("other", holderIdentity="x"))
        api.put(url(api, f"{LEASES}/demo"), json=lease_body("demo", holderIdentity="y"))
        event = watch.next()
        assert event["type"] == "MODIFIED" and event["object"]["metadata"]["name"] == "demo"
        assert event["object"]["spec"]["holderIdentity"] == "y"
        assert watch.events.empty()
    finally:
        watch.close()


def test_a_flood_of_writes_is_sent_as_each_objects_latest_state_per_poll(api: requests.Session) -> None:
    counter = writes.create(Counter, {"name": "hot", "value": 0}, writes.Writer("api", "test"))
    watch = Watch(api, COUNTERS, resourceVersion="1")
    writer = writes.Writer("api", "flood")
    try:
        time.sleep(0.3)
        for value in range(1, 201):
            counter = writes.update(counter, {"value": value}, writer, expected_version=ANY)
        seen = []
        while not seen or seen[-1] != 200:
            seen.append(watch.next()["object"]["spec"]["value"])
        assert len(seen) < 100, "each poll sends the object once, with its latest value"
        assert seen == sorted(seen)
    finally:
        watch.close()


def test_watch_honours_timeout_seconds(api: requests.Session) -> None:
    started = time.monotonic()
    response = api.get(url(api, LEASES), params={"watch": "1", "timeoutSeconds": "1"}, timeout=10)
    assert response.status_code == 200 and response.text == ""
    assert 0.9 <= time.monotonic() - started < 5
