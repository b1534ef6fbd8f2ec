"""Watches of one query share one poll (occviz/api/watch.py): each still gets exactly its own stream."""

from __future__ import annotations

import requests

from tests.api.conftest import LEASES, lease_body
from tests.api.test_resources import url
from tests.api.test_watch import Watch


def test_watches_of_one_query_each_get_every_change_and_a_later_one_only_what_follows_its_list(
    api: requests.Session,
) -> None:
    api.post(url(api, LEASES), json=lease_body("shared"))
    first = Watch(api, LEASES)
    second = Watch(api, LEASES)
    watches = [first, second]
    try:
        for watch in watches:
            added = watch.next()
            assert (added["type"], added["object"]["metadata"]["name"]) == ("ADDED", "shared")
        api.put(url(api, f"{LEASES}/shared"), json=lease_body("shared", holderIdentity="b"))
        for watch in watches:
            modified = watch.next()
            assert modified["type"] == "MODIFIED" and modified["object"]["spec"]["holderIdentity"] == "b"
        # Joining the running poll from a list's version: nothing of what the list showed comes again.
        listed = api.get(url(api, LEASES)).json()
        later = Watch(api, LEASES, resourceVersion=listed["metadata"]["resourceVersion"])
        watches.append(later)
        api.delete(url(api, f"{LEASES}/shared"))
        for watch in watches:
            deleted = watch.next()
            assert (deleted["type"], deleted["object"]["metadata"]["name"]) == ("DELETED", "shared")
            assert watch.events.empty()
    finally:
        for watch in watches:
            watch.close()
