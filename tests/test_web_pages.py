"""The dashboard's pages through Django's test client: sign-in, launch form, job page, cancel."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django_tasks_db.models import DBTaskResult

from occviz.jobs.models import Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job

pytestmark = pytest.mark.django_db

VALID = {"strategy": "occ", "writers": "4", "increments": "10", "retry": "k8s-default-backoff"}


@pytest.mark.parametrize(
    "url",
    ["/", "/jobs/new/counter/", "/jobs/1/", "/jobs/1/replay/", "/jobs/compare/?ids=1,2", "/jobs/1/export.csv"],
)
def test_pages_send_anonymous_visitors_to_sign_in(client: Client, url: str) -> None:
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_script_endpoints_answer_anonymous_with_401(client: Client) -> None:
    assert client.get("/jobs/1/events.json").status_code == 401
    assert client.get("/jobs/1/summary.json").status_code == 401


def test_anonymous_post_launches_nothing(client: Client) -> None:
    response = client.post("/jobs/new/counter/", VALID)
    assert response.status_code == 302
    assert not Job.objects.exists()


def test_a_user_signs_in_with_a_csrf_protected_form(alice: User) -> None:
    client = Client(enforce_csrf_checks=True)
    page = client.get("/accounts/login/")
    assert b"csrfmiddlewaretoken" in page.content
    rejected = client.post("/accounts/login/", {"username": "alice", "password": "correct horse battery"})
    assert rejected.status_code == 403
    token = page.cookies["csrftoken"].value
    response = client.post(
        "/accounts/login/",
        {"username": "alice", "password": "correct horse battery", "csrfmiddlewaretoken": token},
    )
    assert response.status_code == 302
    assert response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_wrong_password_is_refused(client: Client, alice: User) -> None:
    response = client.post("/accounts/login/", {"username": "alice", "password": "nope"})
    assert response.status_code == 200
    assert b"correct username and password" in response.content


def test_sign_out_is_a_post(signed_in: Client) -> None:
    assert signed_in.get("/accounts/logout/").status_code == 405
    assert signed_in.post("/accounts/logout/").status_code == 200
    assert signed_in.get("/").status_code == 302


def test_home_shows_only_the_scenarios_that_exist_and_the_jobs(signed_in: Client, alice: User) -> None:
    running = Job.objects.create(
        scenario="counter", params={"strategy": "occ", "writers": 7}, status="running", created_by=alice
    )
    done = Job.objects.create(
        scenario="counter",
        params={"strategy": "none", "writers": 8},
        status="succeeded",
        created_by=alice,
        invariant_ok=True,
        summary={"conflicts": 0, "lost_updates": 42, "invariant": "42 updates lost, counted exactly"},
    )
    response = signed_in.get("/")
    html = response.content.decode()
    assert "Counter race" in html
    assert "coming" not in html.lower()
    assert f'href="/jobs/{running.pk}/"' in html
    assert f'href="/jobs/{done.pk}/"' in html
    warning = '<span class="verdict warn" title="Invariant holds: 42 updates lost, counted exactly">'
    assert f"{warning}⚠ 42 lost updates</span>" in html
    assert "✔ invariant holds" not in html
    assert 'hx-trigger="every 2s"' in html


def test_home_jobs_partial_for_htmx_polling(signed_in: Client) -> None:
    Job.objects.create(scenario="counter", params={"strategy": "occ", "writers": 3}, status="queued")
    response = signed_in.get("/", headers={"HX-Request": "true"})
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="jobs"')
    assert "<html" not in html


def test_launch_form_renders_every_counter_field_and_the_presets(signed_in: Client) -> None:
    html = signed_in.get("/jobs/new/counter/").content.decode()
    for name in ("strategy", "writers", "increments", "seconds", "rows", "think_ms", "retry", "max_attempts"):
        assert f'name="{name}"' in html
    for title in (
        "Lost update demo",
        "k8s default backoff",
        "k8s default retry",
        "Pessimistic lock queue",
        "Serializable retries",
        "Atomic increment",
    ):
        assert title in html
    assert 'hx-post="/jobs/new/counter/"' in html
    assert "csrfmiddlewaretoken" in html


def test_a_preset_fills_the_form(signed_in: Client) -> None:
    html = signed_in.get("/jobs/new/counter/?preset=lost-update-demo").content.decode()
    assert '<option value="none" selected>' in html
    assert 'name="writers" value="8"' in html
    assert 'name="think_ms" value="20"' in html
    assert 'name="seconds" value="8"' in html  # set by time: long enough to watch, and it ends by itself
    partial = signed_in.get("/jobs/new/counter/?preset=k8s-default-backoff", headers={"HX-Request": "true"})
    text = partial.content.decode()
    assert text.lstrip().startswith('<div id="launch">')
    assert '<option value="occ" selected>' in text


def _presets() -> list[tuple[str, str]]:
    from occviz.scenarios import SCENARIOS

    return [(spec.name, preset.slug) for spec in SCENARIOS.values() for preset in spec.presets]


@pytest.mark.parametrize(("scenario", "slug"), _presets())
def test_every_preset_is_a_valid_launch(signed_in: Client, scenario: str, slug: str) -> None:
    from occviz.scenarios import SCENARIOS

    spec = SCENARIOS[scenario]
    preset = next(p for p in spec.presets if p.slug == slug)
    assert spec.form_class(data=preset.params).is_valid()


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({**VALID, "writers": "0"}, "writers", "greater than or equal to 1"),
        ({**VALID, "writers": "100000"}, "writers", "OCCVIZ_MAX_WRITERS"),
        ({**VALID, "strategy": "yolo"}, "strategy", "Select a valid choice"),
        ({**VALID, "seconds": "2"}, "seconds", "not both"),
        ({**VALID, "think_ms": "-1"}, "think_ms", "greater than or equal to 0"),
    ],
)
def test_bad_input_shows_the_error_next_to_its_field_and_launches_nothing(
    signed_in: Client, data: dict[str, str], field: str, message: str
) -> None:
    response = signed_in.post("/jobs/new/counter/", data)
    assert response.status_code == 400
    html = response.content.decode()
    assert "Nothing was launched" in html
    error_at = html.index(f'id="id_{field}_error"')
    assert html.rindex(f'name="{field}"', 0, error_at) > html.rindex('data-field="', 0, error_at)
    assert message in html[error_at : error_at + 400]
    assert not Job.objects.exists()
    assert not DBTaskResult.objects.exists()


def test_bad_input_over_htmx_returns_the_form_partial_with_errors(signed_in: Client) -> None:
    response = signed_in.post("/jobs/new/counter/", {**VALID, "writers": "-3"}, headers={"HX-Request": "true"})
    assert response.status_code == 200  # htmx 2 only swaps 2xx answers
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="launch">')
    assert 'id="id_writers_error"' in html
    assert not Job.objects.exists()


def test_a_valid_launch_queues_a_job_and_its_task(
    signed_in: Client, alice: User, django_capture_on_commit_callbacks: object
) -> None:
    with django_capture_on_commit_callbacks(execute=True):  # type: ignore[operator]
        response = signed_in.post("/jobs/new/counter/", VALID)
    job = Job.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/jobs/{job.pk}/"
    assert (job.status, job.params["strategy"], job.created_by) == ("queued", "occ", alice)
    assert job.params["writers"] == 4
    task = DBTaskResult.objects.get()
    assert task.task_path.endswith("run_job_task")
    assert task.args_kwargs["args"] == [job.pk]


def test_an_htmx_launch_redirects_with_hx_redirect(signed_in: Client) -> None:
    response = signed_in.post("/jobs/new/counter/", VALID, headers={"HX-Request": "true"})
    job = Job.objects.get()
    assert response["HX-Redirect"] == f"/jobs/{job.pk}/"


def test_unknown_scenario_is_404(signed_in: Client) -> None:
    assert signed_in.get("/jobs/new/leader/").status_code == 404


def test_job_page_has_the_timeline_charts_and_cancel(signed_in: Client, alice: User) -> None:
    job = Job.objects.create(scenario="counter", params={"strategy": "occ", "writers": 4}, created_by=alice)
    html = signed_in.get(f"/jobs/{job.pk}/").content.decode()
    assert "data-timeline" in html
    assert "data-rates" in html
    assert f'action="/jobs/{job.pk}/cancel/"' in html
    assert f'data-ws-path="/ws/jobs/{job.pk}/events/"' in html
    for fragment in ("live-status", "live-figures", "live-state", "live-log"):
        assert f'id="{fragment}"' in html
    assert "static/occviz/viz.js" in html


def test_job_page_shows_the_verdict_of_a_finished_job(signed_in: Client) -> None:
    job = Job.objects.create(
        scenario="counter",
        params={"strategy": "none", "writers": 8},
        status="succeeded",
        invariant_ok=True,
        summary={"invariant": "400 blind writes committed, the value rose by 97", "lost_updates": 303},
    )
    html = signed_in.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="live-status"' in html
    assert "⚠ 303 lost updates" in html and "verdict-warn" in html and "verdict-ok" not in html
    assert "Invariant holds: 400 blind writes committed, the value rose by 97" in html
    assert "data-cancel" not in html
    assert 'ws-connect="/ws/jobs/' not in html  # nothing left to follow
    controls = signed_in.get(f"/jobs/{job.pk}/", headers={"HX-Request": "true", "HX-Target": "controls"})
    assert controls.content.decode().lstrip().startswith('<div id="controls"')


def test_cancel_a_queued_job(signed_in: Client, alice: User) -> None:
    job = Job.objects.create(scenario="counter", params={"strategy": "occ", "writers": 4}, created_by=alice)
    assert signed_in.get(f"/jobs/{job.pk}/cancel/").status_code == 405
    response = signed_in.post(f"/jobs/{job.pk}/cancel/")
    assert response.status_code == 302
    job.refresh_from_db()
    assert (job.status, job.cancel_requested) == ("cancelled", True)


@pytest.mark.parametrize(
    ("referer", "back_to"),
    [
        ("http://testserver/jobs/{pk}/?present=1", "/jobs/{pk}/?present=1"),
        ("http://testserver/jobs/{pk}/", "/jobs/{pk}/"),
        ("http://elsewhere.example/jobs/{pk}/?present=1", "/jobs/{pk}/"),
        ("http://testserver/jobs/{pk}/?present=1&next=//evil", "/jobs/{pk}/"),
    ],
)
def test_a_form_posted_without_htmx_returns_to_the_page_as_it_was(
    signed_in: Client, alice: User, referer: str, back_to: str
) -> None:
    # A key pressed in presenter mode before htmx took the form over posts it plainly: presenter mode stays on.
    job = Job.objects.create(scenario="counter", params={"strategy": "occ", "writers": 4}, created_by=alice)
    response = signed_in.post(f"/jobs/{job.pk}/cancel/", headers={"Referer": referer.format(pk=job.pk)})
    assert response.status_code == 302
    assert response["Location"] == back_to.format(pk=job.pk)


def test_cancel_a_running_job_asks_it_to_stop(signed_in: Client, alice: User) -> None:
    job = Job.objects.create(scenario="counter", params={}, status="running", created_by=alice)
    response = signed_in.post(f"/jobs/{job.pk}/cancel/", headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert "cancelling" in response.content.decode()
    job.refresh_from_db()
    assert (job.status, job.cancel_requested) == ("running", True)


def test_cancel_needs_csrf(alice: User) -> None:
    job = Job.objects.create(scenario="counter", params={}, created_by=alice)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 403
    job.refresh_from_db()
    assert job.status == "queued"


def test_only_the_launcher_or_staff_cancel(signed_in: Client) -> None:
    bob = User.objects.create_user("bob", password="x" * 12)
    job = Job.objects.create(scenario="counter", params={}, created_by=bob)
    assert signed_in.post(f"/jobs/{job.pk}/cancel/").status_code == 403
    job.refresh_from_db()
    assert job.status == "queued"
    staff = User.objects.create_user("teacher", password="x" * 12, is_staff=True)
    teacher = Client()
    teacher.force_login(staff)
    assert teacher.post(f"/jobs/{job.pk}/cancel/").status_code == 302
    job.refresh_from_db()
    assert job.status == "cancelled"


def test_static_assets_are_served_by_the_app(signed_in: Client) -> None:
    for path in ("/static/occviz/app.css", "/static/occviz/viz.js", "/static/occviz/pages.js"):
        response = signed_in.get(path)
        # whitenoise streams the file; close it (response.close() would also close the test's connection)
        for closer in response._resource_closers:
            closer()
        assert response.status_code == 200, path
    html = signed_in.get("/").content.decode()
    assert "django_htmx/htmx-2" in html
    assert "ext/hx-ws-2" in html
    assert "https://" not in html


@pytest.mark.django_db(transaction=True)
def test_a_leader_election_jobs_pages_render_from_its_declaration(signed_in: Client, alice: User) -> None:
    from occviz.jobs.runner import run_job
    from occviz.jobs.tasks import create_job

    params = {"replicas": 2, "lease_duration": 1.5, "renew_deadline": 1.0, "retry_period": 0.25, "seconds": 2}
    job = run_job(create_job("leader-election", params, alice).pk)
    assert job.status == "succeeded" and job.summary["invariant_ok"], job.summary
    page = signed_in.get(f"/jobs/{job.pk}/").content.decode()
    assert f"Job #{job.pk}: Leader election" in page
    assert "kind: Lease" in page and "leaseTransitions: 1" in page
    assert "replica-1" in page and "lease transitions" in page
    assert "renewed the lease." in page, "the log speaks in the kinds' sentences"
    assert "occviz/scenarios/leader_election.js" in page
    assert 'data-control="kill"' not in page, "no failure controls once the job has ended"
    refused = signed_in.post(f"/jobs/{job.pk}/control/", {"action": "kill", "actor": "1"})
    assert refused.status_code == 409 and "controls apply only while it runs" in refused.content.decode()
    assert not job.controls.exists()
    replay = signed_in.get(f"/jobs/{job.pk}/replay/").content.decode()
    assert "scenario-vocabulary" in replay and "leader_election.js" in replay
    other = run_job(create_job("leader-election", {**params, "replicas": 3}, alice).pk)
    compare = signed_in.get(f"/jobs/compare/?ids={job.pk},{other.pk}")
    assert compare.status_code == 200
    assert "most valid leaders at once" in compare.content.decode()
    assert set(compare.context["series"]["jobs"][0]["rates"]) == {"renewed", "conflict", "backed_off"}
    exported = signed_in.get(f"/jobs/{job.pk}/export.jsonl")
    assert b'"kind":"acquired"' in b"".join(exported.streaming_content)  # type: ignore[attr-defined]


def test_a_page_opened_before_the_job_made_its_objects_can_ask_for_their_links(signed_in: Client, alice: User) -> None:
    from occviz.store.models import Counter

    job = Job.objects.create(scenario="counter", params={"strategy": "occ", "writers": 2}, created_by=alice)
    html = signed_in.get(f"/jobs/{job.pk}/").content.decode()
    assert '<section id="watched-objects" aria-label="Its objects" hidden>' in html and "data-watch" not in html
    Counter.objects.create(namespace=f"job-{job.pk}", name="row-1", job=job)
    part = signed_in.get(f"/jobs/{job.pk}/", headers={"HX-Request": "true", "HX-Target": "watched-objects"})
    text = part.content.decode().strip()
    assert text.startswith('<section id="watched-objects" aria-label="Its objects">') and "<html" not in text
    assert f'href="/watch/counters/job-{job.pk}/row-1/" data-watch' in text


def test_the_icon_is_the_apps_own_for_every_page_and_at_favicon_ico(signed_in: Client) -> None:
    icon = Client().get("/favicon.ico")  # asked for by browsers and tools, signed in or not
    assert icon.status_code == 200 and icon["Content-Type"] == "image/x-icon"
    body = b"".join(icon.streaming_content)
    assert body[:4] == b"\x00\x00\x01\x00" and b"PNG" in body[:64]
    for url in ("/", "/accounts/login/"):
        html = (signed_in if url == "/" else Client()).get(url).content.decode()
        assert '<link rel="icon" href="/static/occviz/favicon.svg" type="image/svg+xml">' in html
    svg = Client().get("/static/occviz/favicon.svg")
    assert svg.status_code == 200 and b"<svg" in b"".join(svg.streaming_content)
    for response in (icon, svg):
        response.close()  # last: closing ends the request, and the database connection with it


@pytest.mark.django_db(transaction=True)
def test_compare_says_whose_figure_a_row_is_when_two_scenarios_word_them_alike(signed_in: Client) -> None:
    # Real jobs: compare reads each one's figures from its final snapshot.
    race = run_job(create_job("counter", {"strategy": "occ", "writers": 3, "increments": 20, "think_ms": 2}).pk)
    quota = run_job(create_job("quota", {"pods": 3, "hard": 1, "workers": 3}).pk)
    response = signed_in.get(f"/jobs/compare/?id={race.pk}&id={quota.pk}")
    assert response.status_code == 200
    html = response.content.decode()
    none = '<td class="num">\N{EN DASH}</td>'
    conflicts = (race.summary or {})["conflicts"]
    assert f'<th scope="row">conflicts (counter race)</th><td class="num">{conflicts}</td>{none}' in html
    admission = (quota.summary or {})["admission_conflicts"]
    assert f'<th scope="row">conflicts (quota race)</th>{none}<td class="num">{admission}</td>' in html
    assert '<th scope="row">admitted</th>' in html  # worded by one scenario only: as it is


def test_the_pages_tag_a_job_with_the_label_its_scenario_declares(signed_in: Client) -> None:
    done = {"status": "succeeded", "invariant_ok": True, "summary": {}}
    race = Job.objects.create(scenario="counter", params={"strategy": "occ", "writers": 2}, **done)
    controllers = Job.objects.create(
        scenario="controllers", params={"strategy": "none", "controllers": 2, "rate_per_s": 50, "seconds": 1}, **done
    )
    quota = Job.objects.create(scenario="quota", params={"pods": 2, "workers": 2}, **done)
    for job, tag in ((race, "occ"), (controllers, "none")):
        assert f'<span class="tag">{tag}</span></h1>' in signed_in.get(f"/jobs/{job.pk}/").content.decode()
        assert f'<span class="tag">{tag}</span></h1>' in signed_in.get(f"/jobs/{job.pk}/replay/").content.decode()
    for url in (f"/jobs/{quota.pk}/", f"/jobs/{quota.pk}/replay/"):
        assert 'class="tag"' not in signed_in.get(url).content.decode()  # a quota race declares no label
    compare = signed_in.get(f"/jobs/compare/?id={race.pk}&id={controllers.pk}&id={quota.pk}")
    labels = [series["label"] for series in compare.context["series"]["jobs"]]
    assert labels == [f"#{race.pk} occ", f"#{controllers.pk} none", f"#{quota.pk} quota"]
    html = compare.content.decode()
    assert all(f'<span class="tag">{tag}</span></h2>' in html for tag in ("occ", "none", "quota"))
    strategies = [signed_in.get(f"/jobs/{job.pk}/summary.json").json()["strategy"] for job in (race, quota)]
    assert strategies == ["occ", None]
