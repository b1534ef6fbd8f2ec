"""The scenario boundary: a scenario declared only here runs through the real runner, recorder and stream.

Nothing outside this file knows it: its kinds, sentences, figures, actors and state reach a
websocket client, the page's fragments and the summary from its declaration alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django import forms
from django.core.management import call_command
from django.db import connections

from occviz.jobs.models import Event, Job, JobControl
from occviz.jobs.registry import ParamsError
from occviz.jobs.runner import JobContext, run_job
from occviz.jobs.tasks import create_job
from occviz.scenarios import SCENARIOS, register, unregister
from occviz.scenarios.base import ERROR, Control, EventKind, Figure, Scenario, ScenarioForm, State
from tests.test_live_stream import messages_until_close, session_cookie, socket  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)


class RallyForm(ScenarioForm):
    players = forms.IntegerField(min_value=2, max_value=4, initial=2)
    rallies = forms.IntegerField(min_value=1, max_value=500, initial=40, help_text="Strokes per player.")


# How far the ball has travelled, per job: this scenario's "contended object" lives in memory.
_strokes: dict[int, int] = {}


class Rally(Scenario):
    name = "rally"
    title = "Rally"
    description = "Players hit a ball back and forth."
    form_class = RallyForm
    actor_label = "player {n}"
    actors_param = "players"
    state_keys = ("ball",)
    kinds = (
        EventKind("hit", "hit", ("{who} hit the ball for stroke {value_written}",), "#0a7", "dot"),
        EventKind("miss", "miss", ("{who} missed stroke {value_read}",), "#c00", "cross"),
        EventKind("foul", "foul", ("{who} was called for a foul",), "#fa0", "star"),
        ERROR,
    )
    controls = (Control("foul", "Foul", "Call a foul on this player."),)
    figures = (
        Figure("hits", "hits", count=("hit",)),
        Figure("misses", "misses", count=("miss",), alarm=True),
        Figure("hits_per_s", "hits/s", per_second=("hit",)),
        Figure("strokes", "strokes so far", from_state=True),
    )
    rates = ("hit", "miss")
    compared = (("hits", "hits"),)

    def run(self, context: JobContext) -> dict[str, Any]:
        job_id = context.job.pk
        _strokes[job_id] = 0
        lock = threading.Lock()

        def referee(action: str, actor: int | None, seconds: float | None) -> None:
            if actor is None or actor > context.params["players"]:
                raise ValueError(f"no player {actor}")
            context.recorder.record(actor, 0, 1, "foul")

        context.on_control(referee)

        def player(number: int) -> Any:
            def act(ready: Any) -> None:
                ready()
                for op in range(1, context.params["rallies"] + 1):
                    with lock:
                        _strokes[job_id] += 1
                        stroke = _strokes[job_id]
                    kind = "miss" if stroke % 10 == 0 else "hit"
                    context.recorder.record(number, op, 1, kind, value_read=stroke - 1, value_written=stroke)
                    time.sleep(0.005)

            return act

        context.run_actors([player(n) for n in range(1, context.params["players"] + 1)])
        strokes = _strokes[job_id]
        expected = context.params["players"] * context.params["rallies"]
        return {
            "strokes": strokes,
            "invariant_ok": strokes == expected,
            "invariant": f"{strokes} strokes of {expected}",
        }

    def read_state(self, job_id: int, params: Mapping[str, Any]) -> State:
        strokes = _strokes.get(job_id, 0)
        return State({"ball": {"strokes": strokes}}, {"strokes": strokes})


@pytest.fixture
def rally() -> Iterator[Rally]:
    scenario = Rally()
    register(scenario)
    yield scenario
    unregister(scenario.name)


def run_in_thread(job_id: int) -> None:
    try:
        run_job(job_id)
    finally:
        connections.close_all()


@pytest.mark.asyncio
async def test_a_scenario_declared_in_a_test_reaches_the_stream(rally: Rally, session_cookie: bytes) -> None:  # noqa: F811
    job = await sync_to_async(create_job)("rally", {"players": 3, "rallies": 60})
    communicator = socket(f"/ws/jobs/{job.pk}/events/?html=1", session_cookie)
    assert (await communicator.connect())[0]
    runner = threading.Thread(target=run_in_thread, args=(job.pk,))
    runner.start()
    outputs = [message async for message in messages_until_close(communicator, timeout=30)]
    runner.join(10)

    hello, *frames, end, code = outputs
    assert code == 1000
    vocabulary = hello["scenario"]
    assert vocabulary["name"] == "rally"
    assert [kind["name"] for kind in vocabulary["kinds"]] == ["hit", "miss", "foul", "error"]
    assert vocabulary["kinds"][0]["sentences"] == ["{who} hit the ball for stroke {value_written}"]
    assert [figure["key"] for figure in vocabulary["figures"]] == ["hits", "misses", "hits_per_s", "strokes"]
    assert vocabulary["actors"] == ["player 1", "player 2", "player 3"]
    assert vocabulary["state_keys"] == ["ball"]

    assert frames, "the job's frames reached the socket"
    last = frames[-1]
    assert last["totals"]["hits"] + last["totals"]["misses"] == last["seq_to"]
    assert last["totals"]["misses"] == last["seq_to"] // 10 or last["totals"]["misses"] > 0
    assert "ball" in last and last["ball"]["strokes"] >= last["seq_to"]
    assert last["totals"]["strokes"] == last["ball"]["strokes"]

    assert end["status"] == "succeeded" and end["invariant_ok"] is True
    assert end["summary"]["strokes"] == 180 and end["summary"]["players"] == 3, "parameters are echoed"
    html = end["html"]
    assert "player 2 hit the ball for stroke" in html or "player 1 hit the ball for stroke" in html
    assert 'data-counter="misses" class="bad"' in html, "an alarming figure above zero is shown in red"
    assert "strokes so far" in html


@pytest.mark.asyncio
async def test_its_pages_are_built_from_the_declaration(rally: Rally) -> None:
    from django.contrib.auth.models import User
    from django.test import AsyncClient

    user = await User.objects.acreate(username="coach", is_staff=True)
    client = AsyncClient()
    await client.aforce_login(user)
    form = (await client.get("/jobs/new/rally/")).content.decode()
    assert 'name="rallies"' in form and "Strokes per player." in form
    job = await sync_to_async(lambda: run_job(create_job("rally", {"rallies": 20}, user).pk))()
    page = (await client.get(f"/jobs/{job.pk}/")).content.decode()
    assert f"Job #{job.pk}: Rally" in page
    assert "hits/s" in page and "misses" in page
    assert "player 1" in page, "the log speaks of the scenario's actors"
    home = (await client.get("/")).content.decode()
    assert 'data-scenario="rally"' in home and "New rally" in home


def test_its_parameters_are_checked_by_its_form(rally: Rally) -> None:
    with pytest.raises(ParamsError) as refused:
        create_job("rally", {"players": 1})
    assert "players" in refused.value.errors
    assert not Job.objects.filter(scenario="rally").exists()


def test_runjob_builds_its_flags_from_the_form(rally: Rally, capsys: pytest.CaptureFixture[str]) -> None:
    call_command("runjob", "rally", "--players", "2", "--rallies", "5", "--json")
    assert '"strokes": 10' in capsys.readouterr().out
    assert "rally" in SCENARIOS


def test_a_control_reaches_the_running_program_once(rally: Rally, signed_in: Any, alice: Any) -> None:
    job = create_job("rally", {"players": 2, "rallies": 400}, alice)
    runner = threading.Thread(target=run_in_thread, args=(job.pk,))
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while Job.objects.get(pk=job.pk).status != Job.Status.RUNNING and time.monotonic() < deadline:
            time.sleep(0.02)
        response = signed_in.post(f"/jobs/{job.pk}/control/", {"action": "foul", "actor": "2"}, HTTP_HX_REQUEST="true")
        assert response.status_code == 202
        assert "Sent: foul player 2." in response.content.decode()
        refused = signed_in.post(f"/jobs/{job.pk}/control/", {"action": "foul", "actor": "9"})
        assert refused.status_code == 400 and "one of the job's 2 actors" in refused.content.decode()
        unknown = signed_in.post(f"/jobs/{job.pk}/control/", {"action": "dive", "actor": "1"})
        assert unknown.status_code == 400 and "it offers: foul" in unknown.content.decode()
    finally:
        runner.join(30)
    job.refresh_from_db()
    fouls = Event.objects.filter(job=job, kind="foul")
    assert [(event.actor, event.kind) for event in fouls] == [(2, "foul")], "delivered once, to its actor"
    control = JobControl.objects.get(job=job)
    assert control.applied_at is not None and control.outcome == ""


def test_a_control_on_a_finished_job_is_refused_and_changes_nothing(rally: Rally, signed_in: Any, alice: Any) -> None:
    job = run_job(create_job("rally", {"rallies": 3}, alice).pk)
    response = signed_in.post(f"/jobs/{job.pk}/control/", {"action": "foul", "actor": "1"})
    assert response.status_code == 409
    assert f"job {job.pk} is succeeded: controls apply only while it runs" in response.content.decode()
    assert not JobControl.objects.filter(job=job).exists()
    assert Job.objects.get(pk=job.pk).controls_requested == 0
