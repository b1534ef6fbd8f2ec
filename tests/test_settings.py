"""Configuration by environment: bad values stop the start with a clear message."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from occviz.env import database_from_url, envbool, envint, envlist, envpath, redis_url
from tests.conftest import manage


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DEBUG": "maybe"}, "DEBUG='maybe' is not a boolean"),
        ({"DATABASE_URL": "mysql://root@localhost/occviz"}, "occviz runs on PostgreSQL only"),
        ({"DATABASE_URL": "postgresql://localhost"}, "DATABASE_URL names no database"),
        ({"REDIS_URL": "http://127.0.0.1:6379"}, "REDIS_URL='http://127.0.0.1:6379' is not a redis:// URL"),
        ({"OCCVIZ_MAX_WRITERS": "lots"}, "OCCVIZ_MAX_WRITERS='lots' is not a whole number"),
        ({"OCCVIZ_MAX_WRITERS": "0"}, "OCCVIZ_MAX_WRITERS=0 is out of range"),
        ({"OCCVIZ_MAX_SECONDS": "99999999"}, "OCCVIZ_MAX_SECONDS=99999999 is out of range"),
        ({"ALLOWED_HOSTS": " , "}, "ALLOWED_HOSTS is set but empty"),
        ({"SECRET_KEY": " "}, "SECRET_KEY is set but empty"),
        ({"OCCVIZ_DATA_DIR": " "}, "OCCVIZ_DATA_DIR is set but empty"),
        ({"OCCVIZ_HTTPS": "sometimes"}, "OCCVIZ_HTTPS='sometimes' is not a boolean"),
        ({"OCCVIZ_HSTS_SECONDS": "-1"}, "OCCVIZ_HSTS_SECONDS=-1 is out of range: it must be at least 0"),
    ],
)
def test_a_bad_setting_stops_the_start_with_a_clear_error(env: dict[str, str], message: str) -> None:
    result = manage("check", env=env, timeout=60)
    assert result.returncode != 0
    assert message in result.stderr
    assert "ImproperlyConfigured" in result.stderr


def test_typed_readers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLAG", "Yes")
    monkeypatch.setenv("COUNT", " 12 ")
    monkeypatch.setenv("HOSTS", "a.example, b.example")
    assert envbool("FLAG", False) is True
    assert envbool("UNSET_FLAG", True) is True
    assert envint("COUNT", 1, maximum=20) == 12
    assert envlist("HOSTS", []) == ["a.example", "b.example"]
    with pytest.raises(ImproperlyConfigured, match="between 1 and 10"):
        envint("COUNT", 1, maximum=10)
    assert envpath("UNSET_FOLDER", tmp_path) == tmp_path
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FOLDER", "data ")
    assert envpath("FOLDER", Path("/elsewhere")) == tmp_path / "data", "relative to where the process started"


def test_database_url_forms() -> None:
    assert database_from_url("postgresql://u:p%40ss@db.example:6543/occ") == {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "occ",
        "USER": "u",
        "PASSWORD": "p@ss",
        "HOST": "db.example",
        "PORT": "6543",
    }
    socket = database_from_url("postgres://postgres@/occ?host=%2Fvar%2Frun%2Fpostgresql")
    assert socket["HOST"] == "/var/run/postgresql"
    assert socket["PORT"] == ""
    with pytest.raises(ImproperlyConfigured, match="invalid port"):
        database_from_url("postgresql://h:notaport/occ")
    assert redis_url("UNSET_REDIS_URL") is None
