"""The conflict-aware admin: no write without the version the editor loaded, and a 409 page when it is stale."""

from __future__ import annotations

import html
import re
import threading
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.core import signing
from django.db import connection
from django.db.models.signals import pre_save
from django.test import Client
from django.utils import timezone

from occviz.jobs.models import Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.store import writes
from occviz.store.cas import ANY, Add, compare_and_swap
from occviz.store.merge import MINE, STORED, merged_changes, three_way
from occviz.store.models import Change, Counter, Lease, Pod, ResourceQuota
from occviz.store.versioned_admin import Loaded
from occviz.store.writes import Writer

pytestmark = pytest.mark.django_db

API_BOB = Writer("api", "bob (token laptop)")


@pytest.fixture
def editor(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("editor", password=None))  # no hashing: force_login
    return client


def hidden(page: str, name: str) -> list[str]:
    """The values of the page's hidden inputs called `name`."""
    return [html.unescape(value) for value in re.findall(rf'name="{name}" value="([^"]*)"', page)]


def change_form(client: Client, obj: Any) -> dict[str, str]:
    """The change form's fields as loaded: what a browser would post back unchanged."""
    url = f"/admin/store/{obj._meta.model_name}/{obj.pk}/change/"
    page = client.get(url).content.decode()
    (loaded,) = hidden(page, "loaded")
    data = {"loaded": loaded, "_save": "Save", "namespace": obj.namespace, "name": obj.name}
    if isinstance(obj, Counter):
        data["value"] = str(obj.value)
    if isinstance(obj, Lease):
        data |= {
            "holder_identity": obj.holder_identity,
            "lease_duration_seconds": str(obj.lease_duration_seconds),
            "lease_transitions": str(obj.lease_transitions),
            "acquire_time_0": "",
            "acquire_time_1": "",
            "renew_time_0": "",
            "renew_time_1": "",
        }
    return data


def post_change(client: Client, obj: Any, data: dict[str, str]) -> Any:
    return client.post(f"/admin/store/{obj._meta.model_name}/{obj.pk}/change/", data)


def said(response: Any) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def test_three_way_merge_takes_my_fields_keeps_theirs_and_asks_where_both_changed() -> None:
    base = {"holder": "a", "duration": 15, "transitions": 0, "note": "x"}
    stored = {"holder": "b", "duration": 15, "transitions": 1, "note": "y"}
    mine = {"holder": "me", "duration": 30, "note": "y"}  # note: both changed it, to the same value
    fields = {field.name: field for field in three_way(base, mine, stored)}
    assert fields["holder"].clash and not fields["holder"].goes_through
    assert fields["duration"].goes_through and not fields["duration"].clash
    assert not fields["transitions"].mine_changed and fields["transitions"].stored_changed
    assert not fields["note"].clash and not fields["note"].goes_through
    merged = list(fields.values())
    assert merged_changes(merged, {"holder": MINE}) == {"holder": "me", "duration": 30}
    assert merged_changes(merged, {"holder": STORED}) == {"duration": 30}
    assert merged_changes(merged, {}) == {"duration": 30}


def test_a_change_form_saved_on_the_version_read_is_written_and_logged(editor: Client) -> None:
    counter = Counter.objects.create(name="c", value=5)
    data = change_form(editor, counter) | {"value": "7"}
    response = post_change(editor, counter, data)
    assert response.status_code == 302
    counter.refresh_from_db()
    assert (counter.value, counter.resource_version) == (7, 2)
    change = Change.objects.get()
    assert (change.type, change.via, change.writer, change.expected_version) == ("MODIFIED", "admin", "editor", 1)
    assert any("changed successfully" in message for message in said(response))


def test_a_stale_change_form_gets_the_conflict_page_and_nothing_is_written(editor: Client) -> None:
    counter = Counter.objects.create(name="c", value=5)
    data = change_form(editor, counter) | {"value": "7"}
    writes.update(counter, {"value": 9}, API_BOB, expected_version=1)  # someone else, meanwhile
    response = post_change(editor, counter, data)
    assert response.status_code == 409
    page = response.content.decode()
    assert 'Operation cannot be fulfilled on counters.occviz.dev "c"' in html.unescape(page)
    assert "api bob (token laptop)" in page  # who changed it since
    assert 'href="/watch/counters/default/c/"' in page
    row = re.search(r'<tr data-field="value".*?</tr>', page, re.S)
    assert row is not None
    cells = re.findall(r'<td class="(saw|entered changed|stored changed)">([^<]*)</td>', row.group(0))
    assert cells == [("saw", "5"), ("entered changed", "7"), ("stored changed", "9")]
    assert "changed successfully" not in page
    assert not any("changed successfully" in message for message in said(response))
    counter.refresh_from_db()
    assert (counter.value, counter.resource_version) == (9, 2)
    refused = Change.objects.get(type="CONFLICT")
    assert (refused.writer, refused.expected_version, refused.object["value"]) == ("editor", 1, 7)


def test_the_conflict_page_names_the_job_that_wrote_since(editor: Client) -> None:
    job = Job.objects.create(scenario="counter", params={})
    counter = Counter.objects.create(name="row-1", namespace=f"job-{job.pk}", value=0, job=job)
    data = change_form(editor, counter) | {"value": "7"}
    for version in (1, 2):  # the job's own writes: its events, not Changes
        compare_and_swap(Counter, counter.pk, version, {"value": Add(1)})
    response = post_change(editor, counter, data)
    assert response.status_code == 409
    assert f"job {job.pk} (2 versions)" in response.content.decode()


def test_a_missing_or_altered_version_is_refused(editor: Client) -> None:
    counter = Counter.objects.create(name="c", value=5)
    other = Counter.objects.create(name="other", value=1)
    data = change_form(editor, counter) | {"value": "7"}
    token = data["loaded"]
    altered = token[:-3] + ("AAA" if not token.endswith("AAA") else "BBB")
    # Signed with another key's salt: the content would pass, the signature does not.
    forged = signing.dumps({"m": "store.counter", "pk": counter.pk, "v": 1, "values": {}}, salt="another")
    for loaded in ["", altered, forged, change_form(editor, other)["loaded"]]:
        response = post_change(editor, counter, data | {"loaded": loaded})
        assert response.status_code == 200
        assert "did not carry a valid version" in response.content.decode()
    counter.refresh_from_db()
    assert (counter.value, counter.resource_version) == (5, 1)
    assert not Change.objects.exists()


def test_a_form_with_nothing_changed_writes_nothing_and_says_so(editor: Client) -> None:
    counter = Counter.objects.create(name="c", value=5)
    response = post_change(editor, counter, change_form(editor, counter))
    assert response.status_code == 302
    assert said(response) == ["No field of default/c was changed: nothing was written."]
    counter.refresh_from_db()
    assert counter.resource_version == 1


def test_reapply_merges_the_editors_changes_onto_the_current_version(editor: Client) -> None:
    lease = Lease.objects.create(name="demo", holder_identity="a", lease_duration_seconds=15)
    data = change_form(editor, lease) | {"holder_identity": "editor", "lease_duration_seconds": "30"}
    # Another writer changes the holder (as the editor did) and the transitions (which the editor left).
    writes.update(lease, {"holder_identity": "b", "lease_transitions": 1}, API_BOB, expected_version=1)
    response = post_change(editor, lease, data)
    assert response.status_code == 409
    page = response.content.decode()
    assert 'name="choice_holder_identity"' in page  # both changed it: a choice
    assert 'name="choice_lease_duration_seconds"' not in page  # only the editor did: it goes through
    reapply = {name: hidden(page, name)[0] for name in ("loaded", "_base", "_mine", "_reapply")}

    response = post_change(editor, lease, reapply | {"choice_holder_identity": "stored"})
    assert response.status_code == 302
    lease.refresh_from_db()
    assert (lease.holder_identity, lease.lease_duration_seconds, lease.lease_transitions) == ("b", 30, 1)
    assert lease.resource_version == 3
    assert any("were applied" in message for message in said(response))
    assert Change.objects.filter(type="MODIFIED", writer="editor", expected_version=2).exists()


def test_reapply_onto_a_version_that_moved_again_conflicts_again(editor: Client) -> None:
    lease = Lease.objects.create(name="demo", holder_identity="a")
    data = change_form(editor, lease) | {"holder_identity": "editor"}
    writes.update(lease, {"holder_identity": "b"}, API_BOB, expected_version=1)
    page = post_change(editor, lease, data).content.decode()
    reapply = {name: hidden(page, name)[0] for name in ("loaded", "_base", "_mine", "_reapply")}
    writes.update(lease, {"lease_transitions": 5}, API_BOB, expected_version=2)
    response = post_change(editor, lease, reapply | {"choice_holder_identity": "mine"})
    assert response.status_code == 409
    again = response.content.decode()
    assert 'data-stored-version="3"' in again and 'data-base-version="2"' in again
    reapply = {name: hidden(again, name)[0] for name in ("loaded", "_base", "_mine", "_reapply")}
    assert post_change(editor, lease, reapply).status_code == 302
    lease.refresh_from_db()
    assert (lease.holder_identity, lease.lease_transitions, lease.resource_version) == ("editor", 5, 4)


def test_reapply_with_an_altered_token_writes_nothing(editor: Client) -> None:
    lease = Lease.objects.create(name="demo", holder_identity="a")
    data = change_form(editor, lease) | {"holder_identity": "editor"}
    writes.update(lease, {"holder_identity": "b"}, API_BOB, expected_version=1)
    page = post_change(editor, lease, data).content.decode()
    reapply = {name: hidden(page, name)[0] for name in ("loaded", "_base", "_mine", "_reapply")}
    response = post_change(editor, lease, reapply | {"_mine": reapply["_mine"][:-2] + "xx"})
    assert response.status_code == 302
    assert any("did not carry a valid version" in message for message in said(response))
    lease.refresh_from_db()
    assert (lease.holder_identity, lease.resource_version) == ("b", 2)


def changelist(client: Client, model: str) -> tuple[str, dict[int, str]]:
    """The change list page and its rows' loaded versions by primary key."""
    page = client.get(f"/admin/store/{model}/").content.decode()
    tokens = hidden(page, "_loaded")
    return page, {Loaded.read(token, Counter if model == "counter" else Lease).pk: token for token in tokens}  # type: ignore[union-attr]


def list_edit(client: Client, tokens: dict[int, str], values: dict[int, str], field: str, model: str) -> Any:
    data: dict[str, Any] = {
        "form-TOTAL_FORMS": str(len(values)),
        "form-INITIAL_FORMS": str(len(values)),
        "form-MIN_NUM_FORMS": "0",
        "form-MAX_NUM_FORMS": "1000",
        "_save": "Save",
        "_loaded": list(tokens.values()),
    }
    for index, (pk, value) in enumerate(values.items()):
        data[f"form-{index}-id"] = str(pk)
        data[f"form-{index}-{field}"] = value
    return client.post(f"/admin/store/{model}/", data)


def test_list_editable_writes_the_rows_as_loaded(editor: Client) -> None:
    a = Counter.objects.create(name="a", value=1)
    b = Counter.objects.create(name="b", value=2)
    _, tokens = changelist(editor, "counter")
    response = list_edit(editor, tokens, {a.pk: "10", b.pk: "2"}, "value", "counter")
    assert response.status_code == 302
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.value, a.resource_version, b.resource_version) == (10, 2, 1)  # b was left as it was
    assert said(response) == ["1 counter was changed successfully."]


def test_list_editable_refuses_a_stale_row_and_writes_nothing(editor: Client) -> None:
    a = Counter.objects.create(name="a", value=1)
    b = Counter.objects.create(name="b", value=2)
    _, tokens = changelist(editor, "counter")
    writes.update(a, {"value": 50}, API_BOB, expected_version=1)
    response = list_edit(editor, tokens, {a.pk: "10", b.pk: "20"}, "value", "counter")
    assert response.status_code == 409
    page = response.content.decode()
    assert "changed since this page was loaded: you saw version 1, it is now version 2" in page
    assert "api bob (token laptop)" in page
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.value, b.value, b.resource_version) == (50, 2, 1)
    # The page now carries a's current version: saving again puts the entry onto it.
    tokens = {pk: token for pk, token in zip(tokens, hidden(page, "_loaded"), strict=True)}
    assert list_edit(editor, tokens, {a.pk: "10", b.pk: "20"}, "value", "counter").status_code == 302
    a.refresh_from_db()
    assert (a.value, a.resource_version) == (10, 3)


def test_list_editable_without_the_rows_versions_is_refused(editor: Client) -> None:
    lease = Lease.objects.create(name="demo", holder_identity="a")
    response = list_edit(editor, {}, {lease.pk: "mallory"}, "holder_identity", "lease")
    assert "did not carry a valid version" in response.content.decode()
    lease.refresh_from_db()
    assert (lease.holder_identity, lease.resource_version) == ("a", 1)


def act(client: Client, model: str, action: str, tokens: dict[int, str], selected: list[int]) -> Any:
    data = {"action": action, "index": "0", "_selected_action": [str(pk) for pk in selected]}
    return client.post(f"/admin/store/{model}/", data | {"_loaded": list(tokens.values())})


def test_an_action_refuses_the_rows_changed_since_loaded_and_writes_the_others(editor: Client) -> None:
    a = Counter.objects.create(name="a", value=1)
    b = Counter.objects.create(name="b", value=2)
    _, tokens = changelist(editor, "counter")
    writes.update(a, {"value": 50}, API_BOB, expected_version=1)
    response = act(editor, "counter", "reset", tokens, [a.pk, b.pk])
    assert response.status_code == 302
    messages = said(response)
    assert messages[0] == "Reset 1 counter."
    assert messages[1].startswith("Refused 1, changed since this page was loaded (nothing written to them):")
    assert "default/a (loaded at version 1, now 2)" in messages[1]
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.value, b.value) == (50, 0)
    # Without the page's versions nothing is written, and no success is claimed.
    editor.get("/admin/store/counter/")  # the messages above are shown, and gone
    response = act(editor, "counter", "reset", {}, [a.pk])
    assert [message.startswith("Refused 1") for message in said(response)] == [True]
    a.refresh_from_db()
    assert a.value == 50


def test_release_a_lease_as_release_on_cancel_does(editor: Client) -> None:
    lease = Lease.objects.create(
        name="demo", holder_identity="replica-1", lease_transitions=3, acquire_time=timezone.now()
    )
    _, tokens = changelist(editor, "lease")
    before = timezone.now()
    response = act(editor, "lease", "release", tokens, [lease.pk])
    assert said(response) == ["Released 1 lease."]
    lease.refresh_from_db()
    assert (lease.holder_identity, lease.lease_transitions, lease.lease_duration_seconds) == ("", 3, 1)
    assert lease.renew_time is not None and lease.renew_time >= before
    assert lease.acquire_time == lease.renew_time


def test_recalculate_a_quotas_usage_from_the_pods_that_exist(editor: Client) -> None:
    gpu = "requests.nvidia.com/gpu"
    quota = ResourceQuota.objects.create(name="gpus", namespace="team", hard={gpu: 4}, used={gpu: 4})
    Pod.objects.create(name="p1", namespace="team", requests={gpu: 1}, phase="Running")
    Pod.objects.create(name="p2", namespace="team", requests={gpu: 2, "cpu": 1})
    Pod.objects.create(name="p3", namespace="team", requests={gpu: 1}, phase="Failed")
    Pod.objects.create(name="p4", namespace="other", requests={gpu: 1})
    tokens = {quota.pk: Loaded.of(quota).sign()}
    response = act(editor, "resourcequota", "recalculate", tokens, [quota.pk])
    assert said(response) == ["Recalculated 1 resource quota."]
    quota.refresh_from_db()
    assert (quota.used, quota.resource_version) == ({gpu: 3}, 2)


def test_delete_is_refused_once_the_object_changed(editor: Client) -> None:
    counter = Counter.objects.create(name="c", value=5)
    url = f"/admin/store/counter/{counter.pk}/delete/"
    (loaded,) = hidden(editor.get(url).content.decode(), "loaded")
    writes.update(counter, {"value": 6}, API_BOB, expected_version=1)
    response = editor.post(url, {"post": "yes", "loaded": loaded})
    assert response.status_code == 409
    assert Counter.objects.filter(pk=counter.pk).exists()
    (loaded,) = hidden(editor.get(url).content.decode(), "loaded")
    assert editor.post(url, {"post": "yes", "loaded": loaded}).status_code == 302
    assert not Counter.objects.filter(pk=counter.pk).exists()
    assert Change.objects.filter(type="DELETED", expected_version=2, writer="editor").exists()


def test_add_goes_through_writes_create(editor: Client) -> None:
    response = editor.post("/admin/store/counter/add/", {"namespace": "default", "name": "new", "value": "3"})
    assert response.status_code == 302
    counter = Counter.objects.get(name="new")
    assert (counter.value, counter.resource_version) == (3, 1)
    assert Change.objects.get().type == "ADDED"


@pytest.mark.django_db(transaction=True)
def test_an_add_whose_name_another_writer_took_meanwhile_writes_nothing(editor: Client) -> None:
    taken = threading.Event()

    def store_and_close(name: str, value: int) -> None:
        try:
            Counter.objects.create(name=name, value=value)
        finally:
            connection.close()

    def take_the_name(sender: Any, instance: Counter, **kwargs: Any) -> None:
        # Another writer, on its own connection, stores the name after the form found it free.
        if instance.value == 3 and not taken.is_set():
            taken.set()
            thief = threading.Thread(target=store_and_close, args=("new", 7))
            thief.start()
            thief.join()

    pre_save.connect(take_the_name, sender=Counter)
    try:
        response = editor.post("/admin/store/counter/add/", {"namespace": "default", "name": "new", "value": "3"})
    finally:
        pre_save.disconnect(take_the_name, sender=Counter)
    assert response.status_code == 302
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        'counters.occviz.dev "new" already exists: nothing was written.'
    ]
    assert list(Counter.objects.values_list("name", "value")) == [("new", 7)]
    assert not Change.objects.exists()


def test_the_lists_show_the_version_and_search_and_filter(editor: Client) -> None:
    Counter.objects.create(name="findme", namespace="ns1", value=1)
    Counter.objects.create(name="other", namespace="ns2", value=1)
    page = editor.get("/admin/store/counter/?q=findme").content.decode()
    assert "findme" in page and ">other<" not in page
    page = editor.get("/admin/store/counter/?namespace=ns2").content.decode()
    assert ">other<" in page and "findme" not in page
    assert "column-version" in page


@pytest.mark.django_db(transaction=True)
def test_jobs_events_history_and_tokens_pages(editor: Client) -> None:
    from occviz.api.models import ApiToken

    job = create_job("counter", {"strategy": "occ", "writers": 2, "increments": 3})
    assert run_job(job.pk).status == Job.Status.SUCCEEDED
    counter = Counter.objects.get(job=job)
    writes.update(counter, {"value": 100}, Writer("admin", "editor"), expected_version=ANY)
    row, _ = ApiToken.issue(User.objects.get(username="editor"), "laptop")
    for url in [
        "/admin/jobs/job/",
        "/admin/jobs/job/?q=counter&invariant_ok__exact=1",
        f"/admin/jobs/job/{job.pk}/change/",
        "/admin/jobs/event/",
        f"/admin/jobs/event/?job={job.pk}",
        "/admin/store/change/",
        "/admin/store/change/?via=admin",
        "/admin/api/apitoken/",
    ]:
        assert editor.get(url).status_code == 200, url
    assert ">True<" in editor.get("/admin/store/change/").content.decode() or "icon-yes" in (
        editor.get("/admin/store/change/").content.decode()
    )  # the blind write is shown as blind
    assert editor.get(f"/admin/store/change/{Change.objects.get().pk}/change/").status_code == 200
    assert editor.post(f"/admin/api/apitoken/{row.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not ApiToken.objects.exists()


def test_the_job_list_shows_the_label_each_scenario_declares(editor: Client) -> None:
    Job.objects.create(scenario="counter", params={"strategy": "occ", "writers": 2})
    Job.objects.create(scenario="quota", params={"pods": 2, "workers": 2})
    tags = re.findall(r'<td class="field-tag">([^<]*)</td>', editor.get("/admin/jobs/job/").content.decode())
    assert tags == ["-", "occ"]  # newest first: a quota race declares none


@pytest.mark.django_db(transaction=True)
def test_the_event_list_filters_by_the_kinds_of_every_scenario(editor: Client) -> None:
    job = run_job(create_job("counter", {"strategy": "occ", "writers": 4, "increments": 10, "think_ms": 5}).pk)
    page = editor.get("/admin/jobs/event/").content.decode()
    # Offered whether or not any job recorded one yet: the counter's, the quota's, the leader election's.
    for kind in ("committed", "conflict", "admitted", "resync", "acquired", "fenced", "erased"):
        assert f"?kind={kind}" in page, kind
    conflicts = editor.get(f"/admin/jobs/event/?job={job.pk}&kind=conflict").content.decode()
    shown = re.findall(r'<td class="field-kind">([a-z_]+)</td>', conflicts)
    assert shown and set(shown) == {"conflict"}
