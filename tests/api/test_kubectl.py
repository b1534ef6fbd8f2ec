"""`manage.py kubeconfig`: the kubeconfig kubectl is given, pointing at serve's HTTPS port with its CA and a token."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml
from django.contrib.auth.models import User

from occviz import tls
from occviz.api.models import ApiToken
from tests.conftest import manage
from tests.test_serve import serve_environment

CONFLICT = (
    'Operation cannot be fulfilled on leases.coordination.k8s.io "demo": the object has been modified; '
    "please apply your changes to the latest version and try again"
)


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
