"""The OpenAPI document the app serves, fuzzed by schemathesis against the live Daphne: no input makes a 500."""

from __future__ import annotations

from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode

from tests.api.conftest import COUNTERS, LEASES, lease_body

# Per operation: about 30 operations, so about 450 requests, 20 to 40 s.
EXAMPLES = 15


def test_the_document_is_served_with_every_kind(api_url: str) -> None:
    document = requests.get(api_url + "/openapi.json").json()
    assert document["openapi"].startswith("3.")
    paths = document["paths"]
    assert "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}" in paths
    assert set(paths["/api/v1/namespaces/{namespace}/pods/{name}"]) == {"get", "put", "patch", "delete"}
    assert {"Lease", "Pod", "ResourceQuota", "Counter", "Status"} <= set(document["components"]["schemas"])
    missing = requests.get(api_url + "/openapi/v2")
    assert missing.status_code == 404 and missing.json()["kind"] == "Status"


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda mode: mode.value)
def test_no_request_the_document_allows_makes_a_server_error(api: requests.Session, mode: GenerationMode) -> None:
    """Every operation, EXAMPLES generated requests each (a lease and a counter exist to aim at).

    Its parameters, the If-Match header and the dryRun query included; the negative mode sends
    what the document does not allow (wrong types, missing bodies, bad header values) too.
    """
    base = api.base  # type: ignore[attr-defined]
    api.post(base + LEASES, json=lease_body())
    api.post(base + COUNTERS, json={"metadata": {"name": "hot"}, "spec": {"value": 1}})
    schema = schemathesis.openapi.from_url(base + "/openapi.json", timeout=60)
    headers = {"Authorization": api.headers["Authorization"]}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 20
    in_headers = {p.name for operation in operations for p in operation.headers}
    assert "If-Match" in in_headers
    fuzzed = 0
    for operation in operations:

        @given(case=operation.as_strategy(mode))
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def no_server_error(case: Any) -> None:
            case.call_and_validate(headers=headers, checks=[not_a_server_error], timeout=30)

        try:
            no_server_error()
        except Unsatisfiable:  # nothing in it to send wrong (GET /version): no negative request exists
            assert mode is GenerationMode.NEGATIVE, operation.label
            continue
        fuzzed += 1
    assert fuzzed > 20


def test_openapi_v3_indexes_each_group_version_with_its_kinds_marked(api_url: str) -> None:
    index = requests.get(api_url + "/openapi/v3").json()["paths"]
    assert set(index) == {"api/v1", "apis/coordination.k8s.io/v1", "apis/occviz.dev/v1", "apis/apps/v1"}
    document = requests.get(api_url + index["apis/coordination.k8s.io/v1"]["serverRelativeURL"]).json()
    patch = document["paths"]["/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {
        "group": "coordination.k8s.io",
        "version": "v1",
        "kind": "Lease",
    }
    assert any(parameter["name"] == "fieldValidation" for parameter in patch["parameters"])
