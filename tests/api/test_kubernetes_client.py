"""The official Python client (`kubernetes` on PyPI) against a running serve, over HTTPS, configured only by
`config.load_kube_config(<the file manage.py kubeconfig printed>)`: it reads, creates and replaces a Lease,
and a stale replace is its ApiException 409 with the API server's conflict message."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.api import tls_fixtures
from tests.api.tls_fixtures import TlsServer

# Fixtures are found by name in the module (tests/api/conftest.py is the API's own).
start_tls_server, tls_server = tls_fixtures.start_tls_server, tls_fixtures.tls_server


@pytest.fixture
def leases(tls_server: TlsServer, tmp_path: Path) -> Iterator[client.CoordinationV1Api]:
    """CoordinationV1Api as a program gets it after `config.load_kube_config(<file>)`, and nothing else."""
    User.objects.create_user("alice")
    config.load_kube_config(str(tls_server.kubeconfig("alice", tmp_path / "kubeconfig")))
    api = client.CoordinationV1Api()
    yield api
    api.api_client.close()
    # load_kube_config set the process-wide default: leave the next test a fresh one.
    client.Configuration.set_default(client.Configuration())


def lease(holder: str, resource_version: str | None = None) -> client.V1Lease:
    now = datetime.datetime.now(datetime.UTC)
    return client.V1Lease(
        metadata=client.V1ObjectMeta(name="demo", resource_version=resource_version),
        spec=client.V1LeaseSpec(
            holder_identity=holder, lease_duration_seconds=15, acquire_time=now, renew_time=now, lease_transitions=0
        ),
    )


@pytest.mark.slow
def test_the_python_client_creates_reads_and_replaces_a_lease_and_a_stale_replace_is_a_409(
    leases: client.CoordinationV1Api, tls_server: TlsServer
) -> None:
    assert leases.api_client.configuration.host == tls_server.https_url

    created = leases.create_namespaced_lease("default", lease("alice"))
    assert created.metadata.name == "demo" and created.spec.holder_identity == "alice"
    read = leases.read_namespaced_lease("demo", "default")
    assert read.metadata.resource_version == created.metadata.resource_version
    assert read.spec.renew_time == created.spec.renew_time  # MicroTime, to the microsecond

    replaced = leases.replace_namespaced_lease("demo", "default", lease("bob", read.metadata.resource_version))
    assert replaced.spec.holder_identity == "bob"
    assert replaced.metadata.resource_version != read.metadata.resource_version

    with pytest.raises(ApiException) as stale:
        leases.replace_namespaced_lease("demo", "default", lease("carol", read.metadata.resource_version))
    assert stale.value.status == 409
    status = json.loads(stale.value.body)
    assert (status["kind"], status["status"], status["reason"], status["code"]) == (
        "Status",
        "Failure",
        "Conflict",
        409,
    )
    assert status["message"] == (
        'Operation cannot be fulfilled on leases.coordination.k8s.io "demo": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    assert leases.read_namespaced_lease("demo", "default").spec.holder_identity == "bob"


@pytest.mark.slow
def test_the_python_client_reading_a_missing_lease_gets_a_404_status(leases: client.CoordinationV1Api) -> None:
    with pytest.raises(ApiException) as missing:
        leases.read_namespaced_lease("nowhere", "default")
    assert missing.value.status == 404
    assert json.loads(missing.value.body)["message"] == 'leases.coordination.k8s.io "nowhere" not found'
