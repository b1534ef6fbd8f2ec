"""Who may use the API, over real HTTP: bearer tokens (valid, invalid, revoked, read-only) and the session with CSRF."""

from __future__ import annotations

import re

import requests
from django.contrib.auth.models import User

from occviz.api.models import ApiToken
from occviz.store.models import Change
from tests.api.conftest import LEASES, PASSWORD, lease_body
from tests.conftest import manage


def test_no_credentials_or_an_invalid_token_is_401_unauthorized(api_url: str) -> None:
    anonymous = requests.get(api_url + LEASES)
    assert anonymous.status_code == 401 and anonymous.json()["reason"] == "Unauthorized"
    assert anonymous.headers["WWW-Authenticate"].startswith("Bearer")
    wrong = requests.get(api_url + LEASES, headers={"Authorization": "Bearer occviz_not-a-token"})
    assert wrong.status_code == 401 and wrong.json()["kind"] == "Status"
    basic = requests.get(api_url + LEASES, auth=("student", PASSWORD))
    assert basic.status_code == 401


def test_a_revoked_token_is_401_from_then_on(api_url: str, student: User) -> None:
    row, token = ApiToken.issue(student, "once")
    headers = {"Authorization": f"Bearer {token}"}
    assert requests.get(api_url + LEASES, headers=headers).status_code == 200
    row.delete()
    assert requests.get(api_url + LEASES, headers=headers).status_code == 401


def test_a_read_only_token_reads_and_is_403_forbidden_to_write(api_url: str, student: User) -> None:
    _, token = ApiToken.issue(student, "viewer", read_only=True)
    headers = {"Authorization": f"Bearer {token}"}
    assert requests.get(api_url + LEASES, headers=headers).status_code == 200
    refused = requests.post(api_url + LEASES, json=lease_body(), headers=headers)
    assert refused.status_code == 403 and refused.json()["reason"] == "Forbidden"
    assert "read-only" in refused.json()["message"]
    assert not Change.objects.exists()


def _signed_in(api_url: str) -> requests.Session:
    browser = requests.Session()
    browser.get(api_url + "/accounts/login/")
    signed_in = browser.post(
        api_url + "/accounts/login/",
        data={"username": "student", "password": PASSWORD, "csrfmiddlewaretoken": browser.cookies["csrftoken"]},
        allow_redirects=False,
    )
    assert signed_in.status_code == 302
    return browser


def test_the_session_reads_and_its_writes_need_the_csrf_token(api_url: str, student: User) -> None:
    browser = _signed_in(api_url)
    assert browser.get(api_url + LEASES).status_code == 200
    forged = browser.post(api_url + LEASES, json=lease_body())
    assert forged.status_code == 403 and "CSRF" in forged.json()["message"]
    made = browser.post(api_url + LEASES, json=lease_body(), headers={"X-CSRFToken": browser.cookies["csrftoken"]})
    assert made.status_code == 201, made.text
    assert Change.objects.get().writer == "student (session)"


def test_the_token_page_creates_a_token_shown_once_that_works_and_revokes_it(api_url: str, student: User) -> None:
    browser = _signed_in(api_url)
    page = browser.post(
        api_url + "/tokens/", data={"name": "laptop", "csrfmiddlewaretoken": browser.cookies["csrftoken"]}
    )
    assert page.status_code == 200
    row = ApiToken.objects.get(user=student)
    shown = re.search(r"<pre><code>(occviz_[\w-]+)</code></pre>", page.text)
    assert shown is not None and shown.group(1).startswith(row.prefix)
    token = shown.group(1)
    headers = {"Authorization": f"Bearer {token}"}
    assert requests.get(api_url + LEASES, headers=headers).status_code == 200
    assert token not in browser.get(api_url + "/tokens/").text  # shown once
    browser.post(api_url + f"/tokens/{row.pk}/revoke/", data={"csrfmiddlewaretoken": browser.cookies["csrftoken"]})
    assert not ApiToken.objects.exists()
    assert requests.get(api_url + LEASES, headers=headers).status_code == 401


def test_the_token_page_needs_a_signed_in_user(api_url: str) -> None:
    response = requests.get(api_url + "/tokens/", allow_redirects=False)
    assert response.status_code == 302 and "/accounts/login/" in response.headers["Location"]


def test_apitoken_prints_a_working_token_alone_on_its_last_line(api_url: str, database_url: str, student: User) -> None:
    done = manage("apitoken", "student", "--name", "script", env={"DATABASE_URL": database_url})
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip().splitlines()[-1]
    assert token.startswith("occviz_") and " " not in token
    assert ApiToken.objects.get().name == "script"
    assert requests.get(api_url + LEASES, headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_apitoken_for_an_unknown_user_fails_clearly_and_makes_nothing(database_url: str) -> None:
    done = manage("apitoken", "nobody", env={"DATABASE_URL": database_url})
    assert done.returncode != 0
    assert "no user named 'nobody'" in done.stderr
    assert not ApiToken.objects.exists()
