"""Lists, gets and watches as the Table kubectl asks for: the columns a cluster prints (a Lease's HOLDER)."""

from __future__ import annotations

import json
import re

import pytest
import requests

from occviz.api.tables import human_duration
from tests.api.conftest import LEASES, lease_body
from tests.api.test_resources import url

# What kubectl v1.32 sends for `kubectl get leases`.
AS_TABLE = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)


def test_a_list_and_a_get_as_a_table_have_the_columns_a_cluster_prints(api: requests.Session) -> None:
    assert api.post(url(api, LEASES), json=lease_body("demo")).status_code == 201
    assert api.post(url(api, LEASES), json=lease_body("free", holderIdentity="")).status_code == 201

    table = api.get(url(api, LEASES), headers={"Accept": AS_TABLE}).json()
    assert (table["apiVersion"], table["kind"]) == ("meta.k8s.io/v1", "Table")
    assert [column["name"] for column in table["columnDefinitions"]] == ["Name", "Holder", "Age"]
    assert [row["cells"][:2] for row in table["rows"]] == [["demo", "a"], ["free", "<none>"]]
    assert all(re.fullmatch(r"\d+s", row["cells"][2]) for row in table["rows"])
    row_object = table["rows"][0]["object"]
    assert row_object["kind"] == "PartialObjectMetadata" and row_object["metadata"]["name"] == "demo"

    one = api.get(url(api, f"{LEASES}/demo"), headers={"Accept": AS_TABLE}).json()
    assert one["kind"] == "Table" and [row["cells"][:2] for row in one["rows"]] == [["demo", "a"]]
    # Without asking for a table, the objects themselves.
    assert api.get(url(api, LEASES)).json()["kind"] == "LeaseList"


def test_a_watch_as_a_table_sends_each_event_as_a_table_of_its_row(api: requests.Session) -> None:
    assert api.post(url(api, LEASES), json=lease_body("demo")).status_code == 201
    params = {"watch": "true", "timeoutSeconds": "1"}
    with api.get(url(api, LEASES), params=params, headers={"Accept": AS_TABLE}, stream=True, timeout=10) as watch:
        events = [json.loads(line) for line in watch.iter_lines() if line]
    assert [event["type"] for event in events] == ["ADDED"]
    shown = events[0]["object"]
    assert shown["kind"] == "Table" and shown["rows"][0]["cells"][:2] == ["demo", "a"]


@pytest.mark.parametrize(
    ("seconds", "printed"),
    [
        (-3, "0s"),
        (45, "45s"),
        (119, "119s"),
        (120, "2m"),
        (200, "3m20s"),
        (1500, "25m"),
        (5 * 3600 + 600, "5h10m"),
        (10 * 3600, "10h"),
        (3 * 86400 + 4 * 3600, "3d4h"),
        (30 * 86400, "30d"),
        (3 * 365 * 86400 + 86400, "3y1d"),
    ],
)
def test_ages_read_as_kubectl_prints_them(seconds: int, printed: str) -> None:
    assert human_duration(seconds) == printed
