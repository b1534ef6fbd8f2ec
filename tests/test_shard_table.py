"""The job page's table of a job's shards, and runjob's lines naming them: read from real shards of real processes.

A counter race over two processes runs in `runjob --processes 2` (a child process of
its own, on the test database); one shard's process is SIGKILLed for real and the page
says which shard failed and why.
"""

from __future__ import annotations

import os
import re
import signal

import pytest
from django.test import Client

from occviz.jobs.models import Job
from tests.helpers import output, wait_for
from tests.test_shards import COUNTER, HOST, running_shards, shards_of, start_manage

__all__ = ["start_manage"]  # the fixture, used here by name

pytestmark = pytest.mark.django_db(transaction=True)


def shard_rows(html: str) -> dict[int, str]:
    """Each shard's row of the page's table, by index."""
    return {int(n): row for n, row in re.findall(r'<tr data-shard="(\d+)"(.*?)</tr>', html, re.S)}


def shards_fragment(client: Client, job: Job) -> str:
    """The table as the running page asks for it every second (htmx, targeting #shards)."""
    response = client.get(f"/jobs/{job.pk}/", headers={"HX-Request": "true", "HX-Target": "shards"})
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="shards"'), html[:200]
    return html


def test_the_table_follows_the_shards_while_they_run_and_shows_why_one_failed(  # type: ignore[no-untyped-def]
    start_manage, admin_client, monkeypatch
) -> None:
    runjob = start_manage(*COUNTER, "--writers", "3", "--seconds", "60", "--think-ms", "2", "--processes", "2")
    job = wait_for(running_shards(2), timeout=60, what="the job's two shards to run")
    coordinator, victim = shards_of(job.pk)

    running = shards_fragment(admin_client, job)
    assert 'hx-trigger="every 1s"' in running, "a running job's table asks for itself again"
    rows = shard_rows(running)
    assert sorted(rows) == [0, 1]
    assert all('data-shard-status="running"' in row for row in rows.values())
    assert "writers 1\u20132" in rows[0] and "writer 3<" in rows[1]
    assert f"runjob on {HOST}<span data-pid>:{coordinator.pid}</span>" in rows[0]
    assert f"runshard on {HOST}<span data-pid>:{victim.pid}</span>" in rows[1]
    heartbeats = [float(age) for age in re.findall(r"([\d.]+) s ago", running)]
    assert len(heartbeats) == 2 and all(age < 2 for age in heartbeats), heartbeats
    page = admin_client.get(f"/jobs/{job.pk}/").content.decode()
    assert page.count('<section id="shards"') == 1 and "2 processes" in page

    # Stopped (SIGSTOP), shard 1 renews no heartbeat: past the page's bound its age is marked late, before the
    # coordinator (whose bound is 2 s) fails it.
    monkeypatch.setenv("OCCVIZ_SHARD_HEARTBEAT_TIMEOUT_S", "1")
    os.kill(victim.pid, signal.SIGSTOP)
    late = shard_rows(wait_for(lambda: "data-shard-late" in (html := shards_fragment(admin_client, job)) and html))
    assert "data-shard-late" in late[1] and "data-shard-late" not in late[0], late
    os.kill(victim.pid, signal.SIGKILL)
    assert runjob.wait(30) == 1, output(runjob)
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    ended = shards_fragment(admin_client, job)
    assert "hx-trigger" not in ended, "a finished job's table stops asking"
    rows = shard_rows(ended)
    assert 'data-shard-status="failed"' in rows[1]
    why = re.search(r"<span class=\"shard-error\" data-shard-error>(.*?)</span>", rows[1], re.S)
    assert why and "stopped renewing its heartbeat" in why.group(1), rows[1]
    assert re.search(r"at \d+\.\d s", rows[1]), "when it ended, from the job's start"


def test_a_job_in_one_process_has_no_table(start_manage, admin_client) -> None:  # type: ignore[no-untyped-def]
    runjob = start_manage(*COUNTER, "--writers", "2", "--increments", "5")
    assert runjob.wait(60) == 0, output(runjob)
    job = Job.objects.get()
    assert 'id="shards"' not in admin_client.get(f"/jobs/{job.pk}/").content.decode()


def test_runjob_names_each_shard_on_a_line_of_its_own(start_manage) -> None:  # type: ignore[no-untyped-def]
    runjob = start_manage(*COUNTER, "--writers", "3", "--increments", "10", "--processes", "2")
    assert runjob.wait(60) == 0, output(runjob)
    lines = [line for line in output(runjob)[0].splitlines() if line.lstrip().startswith("shard ")]
    assert len(lines) == 2, output(runjob)[0]
    assert re.fullmatch(rf"  shard 0 of 2: writers 1-2 in runjob:{HOST}:{runjob.pid}", lines[0]), lines
    assert re.fullmatch(rf"  shard 1 of 2: writer 3 in runshard:{HOST}:\d+", lines[1]), lines
