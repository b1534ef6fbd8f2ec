"""The real kubectl against a running serve, with the kubeconfig `manage.py kubeconfig` prints and no other flag:
get, get -o yaml, create, get -w, replace (a stale resourceVersion prints the API server's conflict message), delete."""

from __future__ import annotations

import base64
import os
import queue
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.contrib.auth.models import User

from occviz import tls
from occviz.api.models import ApiToken
from occviz.supervisor import ServeAddress, ServeLock
from tests.api import tls_fixtures
from tests.api.tls_fixtures import TlsServer, require_kubectl
from tests.conftest import manage
from tests.test_serve import serve_environment

# Fixtures are found by name in the module (tests/api/conftest.py is the API's own).
start_tls_server, tls_server = tls_fixtures.start_tls_server, tls_fixtures.tls_server

CONFLICT = (
    'Operation cannot be fulfilled on leases.coordination.k8s.io "demo": the object has been modified; '
    "please apply your changes to the latest version and try again"
)


class Kubectl:
    """kubectl with one kubeconfig and a home of its own (its discovery cache starts empty)."""

    def __init__(self, binary: str, kubeconfig: Path, home: Path) -> None:
        self.binary, self.kubeconfig = binary, kubeconfig
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}

    def argv(self, *args: str) -> list[str]:
        return [self.binary, "--kubeconfig", str(self.kubeconfig), *args]

    def run(self, *args: str, stdin: str | None = None, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(self.argv(*args), env=self.env, input=stdin, capture_output=True, text=True, timeout=60)
        if ok and done.returncode != 0:
            # What kubectl asked and was answered, to say what the server got wrong.
            traced = subprocess.run(self.argv("-v=8", *args), env=self.env, input=stdin, capture_output=True, text=True)
            pytest.fail(f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stderr}\n-v=8:\n{traced.stderr}")
        return done

    def follow(self, *args: str) -> Lines:
        """kubectl running on (as `get -w` does), its output lines read as they come."""
        process = subprocess.Popen(
            self.argv(*args), env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        return Lines(process)


class Lines:
    """A child's output lines as they come, read by a thread so that waiting for one never blocks the test."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process, self.seen, self._queue = process, list[str](), queue.Queue[str]()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line)

    def kill(self) -> None:
        """Kill the child, and close its output once the reader has seen its end."""
        self.process.kill()
        self.process.wait()
        self._reader.join(timeout=5)
        assert self.process.stdout is not None
        self.process.stdout.close()

    def wait_for(self, text: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.seen.append(line)
            if text in line:
                return line
        pytest.fail(f"no line with {text!r} within {timeout} s; seen: {self.seen}")


def lease_yaml(holder: str, resource_version: str | None = None) -> str:
    version = f"\n  resourceVersion: {resource_version!r}" if resource_version else ""
    return (
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\n"
        f"metadata:\n  name: demo\n  namespace: default{version}\n"
        f"spec:\n  holderIdentity: {holder}\n  leaseDurationSeconds: 15\n"
    )


@pytest.fixture
def kubectl(tls_server: TlsServer, tmp_path: Path) -> Kubectl:
    binary = require_kubectl()
    User.objects.create_user("alice")
    return Kubectl(binary, tls_server.kubeconfig("alice", tmp_path / "kubeconfig"), tmp_path / "home")


# kubectl validates what it creates or replaces on the server once the server's OpenAPI v3 document says it can
# (a `fieldValidation` parameter on the kind's PATCH); it reads that document with JSON Schema draft 4, where
# exclusiveMinimum is a boolean, and gives up on one with a number there (OpenAPI 3.1's form): both must work.
@pytest.mark.slow
@pytest.mark.parametrize("validate", [(), ("--validate=false",)], ids=["validated", "unvalidated"])
def test_kubectl_gets_creates_watches_replaces_and_deletes_a_lease(
    kubectl: Kubectl, tmp_path: Path, validate: tuple[str, ...]
) -> None:
    version = kubectl.run("version")
    assert "Client Version: v1." in version.stdout and "Server Version: v1." in version.stdout

    empty = kubectl.run("get", "leases")
    assert "No resources found in default namespace." in empty.stderr

    manifest = tmp_path / "lease.yaml"
    manifest.write_text(lease_yaml("alice"))
    assert kubectl.run("create", *validate, "-f", str(manifest)).stdout == "lease.coordination.k8s.io/demo created\n"
    listed = kubectl.run("get", "leases").stdout.splitlines()
    # The columns a cluster prints for leases: the API serves kubectl the Table it asks for.
    assert listed[0].split() == ["NAME", "HOLDER", "AGE"] and listed[1].split()[:2] == ["demo", "alice"], listed

    stored = yaml.safe_load(kubectl.run("get", "lease", "demo", "-o", "yaml").stdout)
    assert (stored["apiVersion"], stored["kind"]) == ("coordination.k8s.io/v1", "Lease")
    assert stored["metadata"]["name"] == "demo" and stored["metadata"]["namespace"] == "default"
    assert (stored["spec"]["holderIdentity"], stored["spec"]["leaseDurationSeconds"]) == ("alice", 15)
    seen_version = stored["metadata"]["resourceVersion"]

    lines = kubectl.follow("get", "leases", "-w")
    try:
        lines.wait_for("demo")  # the list it starts from
        manifest.write_text(lease_yaml("bob", seen_version))
        replaced = kubectl.run("replace", *validate, "-f", str(manifest))
        assert replaced.stdout == "lease.coordination.k8s.io/demo replaced\n"
        lines.wait_for("demo")  # the change, as it happens
    finally:
        lines.kill()

    manifest.write_text(lease_yaml("carol", seen_version))  # the version bob's replace made stale
    stale = kubectl.run("replace", *validate, "-f", str(manifest), ok=False)
    assert stale.returncode == 1
    assert stale.stderr == f'Error from server (Conflict): error when replacing "{manifest}": {CONFLICT}\n'
    assert yaml.safe_load(kubectl.run("get", "lease", "demo", "-o", "yaml").stdout)["spec"]["holderIdentity"] == "bob"

    assert kubectl.run("delete", "lease", "demo").stdout == 'lease.coordination.k8s.io "demo" deleted\n'
    gone = kubectl.run("get", "lease", "demo", ok=False)
    assert gone.stderr == 'Error from server (NotFound): leases.coordination.k8s.io "demo" not found\n'


@pytest.mark.slow
def test_kubectl_lists_the_counters_a_custom_resource(kubectl: Kubectl) -> None:
    listed = kubectl.run("get", "counters", "-n", "demo").stdout  # serve's demo data
    assert [line.split()[0] for line in listed.splitlines()[1:]] == ["cold", "hot", "warm"], listed


@pytest.mark.slow
def test_kubectl_with_a_revoked_token_is_told_it_must_log_in(kubectl: Kubectl) -> None:
    ApiToken.objects.filter(name="kubeconfig").delete()
    refused = kubectl.run("get", "leases", ok=False)
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: You must be logged in to the server (Unauthorized")


@pytest.mark.django_db(transaction=True)
def test_kubeconfig_points_at_serves_https_port_with_its_ca_and_a_new_token(database_url: str, tmp_path: Path) -> None:
    alice = User.objects.create_user("alice")
    made = manage("kubeconfig", "alice", env=serve_environment(database_url, tmp_path))
    assert made.returncode == 0, made.stderr
    config = yaml.safe_load(made.stdout)
    [cluster], [context], [user] = config["clusters"], config["contexts"], config["users"]
    assert cluster["cluster"]["server"] == "https://127.0.0.1:8443"
    ca = (tmp_path / tls.TLS_DIR / tls.CA_FILE).read_bytes()
    assert base64.b64decode(cluster["cluster"]["certificate-authority-data"]) == ca
    assert context["context"] == {"cluster": cluster["name"], "namespace": "default", "user": user["name"]}
    assert config["current-context"] == context["name"]
    row = ApiToken.authenticate(user["user"]["token"])
    assert row is not None and row.user == alice and row.name == "kubeconfig"


@pytest.mark.slow
def test_kubeconfig_points_at_the_running_serves_https_port_and_at_the_setting_once_it_stopped(
    tls_server: TlsServer,
) -> None:
    User.objects.create_user("alice")

    def server() -> str:
        made = manage("kubeconfig", "alice", env=tls_server.env)
        assert made.returncode == 0, made.stderr
        return str(yaml.safe_load(made.stdout)["clusters"][0]["cluster"]["server"])

    assert tls_server.served.tls_port != settings.OCCVIZ_TLS_PORT  # a free port, not the setting's
    assert server() == tls_server.https_url
    tls_server.served.stop()
    assert server() == f"https://127.0.0.1:{settings.OCCVIZ_TLS_PORT}"


@pytest.mark.django_db(transaction=True)
def test_kubeconfig_reaches_a_serve_listening_on_every_address_at_127_0_0_1(database_url: str, tmp_path: Path) -> None:
    User.objects.create_user("alice")
    for everywhere in ("0.0.0.0", "[::]"):
        lock = ServeLock(tmp_path)  # held as serve holds it, by this process
        lock.acquire(ServeAddress(f"http://{everywhere}:8000/", os.getpid(), f"https://{everywhere}:9443/"))
        try:
            made = manage("kubeconfig", "alice", env=serve_environment(database_url, tmp_path))
        finally:
            lock.release()
        assert made.returncode == 0, made.stderr
        assert yaml.safe_load(made.stdout)["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:9443", everywhere


@pytest.mark.django_db(transaction=True)
def test_kubeconfig_for_an_unknown_user_fails_and_creates_no_token(database_url: str, tmp_path: Path) -> None:
    refused = manage("kubeconfig", "nobody", env=serve_environment(database_url, tmp_path))
    assert refused.returncode == 1
    assert refused.stdout == ""
    assert "There is no user 'nobody': no kubeconfig made, no token created." in refused.stderr
    assert not ApiToken.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_kubeconfig_refuses_a_plain_http_server(database_url: str, tmp_path: Path) -> None:
    User.objects.create_user("alice")
    refused = manage(
        "kubeconfig", "alice", "--server", "http://127.0.0.1:8000", env=serve_environment(database_url, tmp_path)
    )
    assert refused.returncode == 1
    assert "kubectl sends no token over plain HTTP" in refused.stderr
    assert not ApiToken.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_kubeconfig_with_a_publicly_trusted_certificate_carries_no_ca(database_url: str, tmp_path: Path) -> None:
    User.objects.create_user("alice")
    own = tls.generated_files(tmp_path / "own")
    env = serve_environment(
        database_url, tmp_path / "data", OCCVIZ_TLS_CERT=str(own.certificate), OCCVIZ_TLS_KEY=str(own.key)
    )
    made = manage("kubeconfig", "alice", "--server", "https://occviz.example.org", env=env)
    assert made.returncode == 0, made.stderr
    [cluster] = yaml.safe_load(made.stdout)["clusters"]
    assert cluster["cluster"] == {"server": "https://occviz.example.org"}


@pytest.mark.django_db(transaction=True)
def test_kubeconfig_follows_the_https_port_setting_and_needs_a_server_without_one(
    database_url: str, tmp_path: Path
) -> None:
    User.objects.create_user("alice")
    moved = manage("kubeconfig", "alice", env=serve_environment(database_url, tmp_path, OCCVIZ_TLS_PORT="9443"))
    assert yaml.safe_load(moved.stdout)["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:9443"
    none = manage("kubeconfig", "alice", env=serve_environment(database_url, tmp_path, OCCVIZ_TLS_PORT="0"))
    assert none.returncode == 1
    assert "serve has no HTTPS port (OCCVIZ_TLS_PORT=0): give --server https://..." in none.stderr
    assert ApiToken.objects.count() == 1
