"""Step mode on the real PostgreSQL: each actor's own connection and transaction, stepped one statement at a time.

The races here are not hoped for: a script fixes the order of every statement, and a
blocked step really waits in PostgreSQL (its lock wait is what `pg_blocking_pids` shows)
until the blocker commits. What a test checks is recomputed from what PostgreSQL says:
the rows as committed, the SQLSTATE of the step it refused, the sessions it still has.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from occviz.jobs.models import Event, Job, JobControl
from occviz.jobs.runner import run_job
from occviz.jobs.snapshots import snapshot_at
from occviz.jobs.tasks import create_job
from occviz.scenarios.step.job import conninfo
from occviz.steps.builtin import BUILTINS
from occviz.steps.engine import BLOCKED_AFTER_S, Session, StepRefused
from occviz.steps.postgres import SCHEMA_PREFIX, PostgresDialect
from occviz.steps.script import parse
from tests.helpers import JobThread

pytestmark = pytest.mark.django_db(transaction=True)


def run_step(**params: Any) -> Job:
    """A step job in written order, run to its end in this process."""
    job = run_job(create_job("step", {"pace": "written order", **params}).pk)
    assert job.status == Job.Status.SUCCEEDED, job.error
    assert job.summary is not None and job.summary["invariant_ok"], job.summary
    return job


def steps_at(job: Job, line: int) -> dict[str, Any]:
    (step,) = [step for step in job.summary["steps"] if step["line"] == line]  # type: ignore[index]
    return step


def events(job: Job, *kinds: str) -> list[Event]:
    found = Event.objects.filter(job=job).order_by("seq")
    return list(found.filter(kind__in=kinds) if kinds else found)


def detail(event: Event) -> dict[str, Any]:
    return event.detail if isinstance(event.detail, dict) else json.loads(event.detail or "{}")


def sessions_left(schema: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE starts_with(application_name, %s)", [schema])
        return int(cursor.fetchone()[0])


def schema_exists(schema: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [schema])
        return cursor.fetchone() is not None


def wait_for[T](predicate: Callable[[], T], timeout: float = 20.0, what: str = "it") -> T:
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.02)
    return found


# -- the built-in scripts, in written order -----------------------------------------------


def test_the_lost_update_loses_one_increment() -> None:
    job = run_step(script="lost-update")
    summary = job.summary or {}
    assert summary["final"] == {"1": 11, "2": 20}, "two increments committed, the row rose by one"
    assert summary["lost_updates"] == 1
    assert [step["outcome"] for step in summary["steps"]] == ["ok"] * 8
    assert steps_at(job, 4)["rows"] == steps_at(job, 5)["rows"] == [{"id": 1, "value": 10, "version": 1}]
    assert summary["findings"][:1] == ["1 update lost"]
    assert "1 update lost" in summary["invariant"]
    assert summary["connections_released"] and summary["rows_dropped"]


def test_compare_and_swap_turns_the_lost_update_into_a_conflict() -> None:
    job = run_step(script="occ-conflict")
    summary = job.summary or {}
    assert summary["final"] == {"1": 11, "2": 20}
    assert summary["lost_updates"] == 0 and summary["conflicts"] == 1
    refused = steps_at(job, 8)
    assert refused["actor"] == "T2" and refused["conflict"] and refused["rows"] == []
    (conflict,) = events(job, "conflict")
    assert conflict.actor == 2 and detail(conflict)["count"] == 0
    # The version T1's swap made is the one committed.
    assert detail(conflict)["committed"][0] == {"id": 1, "value": 11, "version": 2}


def test_for_update_blocks_and_completes_when_the_blocker_commits() -> None:
    job = run_step(script="for-update-wait")
    waited = steps_at(job, 5)
    assert waited["actor"] == "T2" and waited["outcome"] == "blocked" and waited["blocked_by"] == ["T1"]
    assert waited["then"] == "ok"
    assert waited["rows"] == [{"id": 1, "value": 11, "version": 1}], "it reads T1's committed write once it goes on"
    blocked, t1_commit, resumed = events(job, "blocked", "commit", "resumed")[:3]
    assert (blocked.actor, t1_commit.actor, resumed.actor) == (2, 1, 2)
    assert blocked.seq < t1_commit.seq < resumed.seq, "it went on after T1's commit, and is reported after it"
    assert detail(blocked)["actors"]["T2"] == {
        "status": "blocked", "isolation": "read committed", "waits_for": ["T1"], "next_step": 6,
    }  # fmt: skip
    assert job.summary["final"] == {"1": 12, "2": 20}  # type: ignore[index]


def test_a_deadlock_shows_the_victim_postgresql_aborted() -> None:
    job = run_step(script="deadlock")
    (victim_event,) = events(job, "deadlock")
    assert detail(victim_event)["sqlstate"] == "40P01"
    assert detail(victim_event)["message"] == "deadlock detected"
    victim, other = ("T1", "T2") if victim_event.actor == 1 else ("T2", "T1")
    # Both waited: each blocked on the other before PostgreSQL broke the cycle.
    blocked = {event.actor: detail(event)["waits_for"] for event in events(job, "blocked")}
    assert blocked == {1: ["T2"], 2: ["T1"]}
    # The other's blocked update went on, and only its transaction's writes are committed.
    (other_step,) = [s for s in job.summary["steps"] if s["actor"] == other and s["outcome"] == "blocked"]  # type: ignore[index]
    assert other_step["then"] == "ok"
    (went_on,) = events(job, "resumed")
    assert victim_event.seq < went_on.seq, "the victim's abort released the other: reported in that order"
    expected = {"1": 22, "2": 21} if victim == "T1" else {"1": 11, "2": 12}
    assert job.summary["final"] == expected  # type: ignore[index]
    assert f"deadlock: PostgreSQL aborted {victim} (40P01)" in job.summary["invariant"]  # type: ignore[index]
    # The victim's commit found its transaction failed: COMMIT rolled it back, and says so.
    (rolled_back,) = [e for e in events(job, "abort") if e.actor == victim_event.actor]
    assert detail(rolled_back)["rolled_back"] is True
    # From its failure on, the victim sees none of its own writes: its transaction can only roll back.
    written = {"T1": {1: 11}, "T2": {2: 21}}[victim]
    seen = {row["id"]: row["value"] for row in detail(victim_event)["seen"][victim]}
    assert all(seen.get(row_id) != value for row_id, value in written.items()), seen


def test_write_skew_commits_both_at_repeatable_read() -> None:
    job = run_step(script="write-skew-rr")
    assert job.summary["final"] == {"1": 0, "2": 0}  # type: ignore[index]
    assert job.summary["commits"] == 2 and job.summary["serialization_failures"] == 0  # type: ignore[index]


def test_write_skew_at_serializable_fails_one_with_40001() -> None:
    job = run_step(script="write-skew-serializable")
    (failure,) = events(job, "serialization_failure")
    assert detail(failure)["sqlstate"] == "40001"
    assert detail(failure)["message"].startswith("could not serialize access")
    committed_by = {"T1": {"1": 0, "2": 20}, "T2": {"1": 10, "2": 0}}
    survivor = "T2" if failure.actor == 1 else "T1"
    assert job.summary["final"] == committed_by[survivor]  # type: ignore[index]


def test_a_step_waits_at_most_the_lock_timeout() -> None:
    # T1 never ends its transaction: in written order only T2's own next line waits for its blocked step.
    text = "T1: begin\nT1: update test set value = 11 where id = 1\nT2: update test set value = 12 where id = 1\n"
    text += "T2: commit"
    started = time.monotonic()
    job = run_step(text=text, lock_timeout=1)
    assert 1.0 <= time.monotonic() - started < 5.0
    waited = steps_at(job, 3)
    assert waited["outcome"] == "blocked" and waited["then"] == "error" and waited["sqlstate"] == "55P03"
    assert job.summary["lock_timeouts"] == 1 and job.summary["errors"] == 0  # type: ignore[index]
    assert "T2 timed out waiting for a lock (55P03)" in job.summary["findings"]  # type: ignore[index]
    assert job.summary["final"] == {"1": 10, "2": 20}, "T1's open transaction is rolled back at the end"  # type: ignore[index]


# -- the engine, stepped by hand ----------------------------------------------------------


@pytest.fixture
def session() -> Iterator[Session]:
    with Session(parse(BUILTINS["for-update-wait"].text), PostgresDialect(conninfo(), "engine_test")) as opened:
        yield opened


def test_a_blocked_step_is_reported_within_a_moment_and_other_actors_go_on(session: Session) -> None:
    reported: list[tuple[str, str, bool]] = []
    session.on_outcome = lambda outcome: reported.append((outcome.actor, outcome.status, outcome.resumed))
    for actor in ("T1", "T2", "T1"):
        assert session.advance(actor).status == "ok"
    started = time.perf_counter()
    blocked = session.advance("T2")
    assert time.perf_counter() - started < BLOCKED_AFTER_S + 0.2
    assert blocked.status == "blocked" and blocked.waits_for == ("T1",)
    with pytest.raises(StepRefused, match=r"T2 is blocked: its step on line 5 .* waits for T1"):
        session.advance("T2")
    # T1 goes on meanwhile; T2 sees none of it until T1 commits.
    write = session.advance("T1")
    assert write.rows == [{"id": 1, "value": 11, "version": 1}]
    assert write.committed[0]["value"] == 10 and write.seen["T1"][0]["value"] == 11
    session.advance("T1")
    assert session.wait_idle("T2", 5.0)
    assert reported[-2:] == [("T1", "ok", False), ("T2", "ok", True)]
    assert session.outcomes[-1].rows == [{"id": 1, "value": 11, "version": 1}]
    assert session.outcomes[-1].seen["T2"] == [{"id": 1, "value": 11, "version": 1}]


def test_a_session_releases_its_connections_and_rows_even_with_a_step_blocked() -> None:
    dialect = PostgresDialect(conninfo(), "engine_close")
    session = Session(parse(BUILTINS["for-update-wait"].text), dialect)
    with session:
        for actor in ("T1", "T2", "T1"):
            session.advance(actor)
        assert session.advance("T2").status == "blocked"
        assert sessions_left(dialect.schema) == 3
    wait_for(lambda: sessions_left(dialect.schema) == 0, 3.0, "the sessions to end")
    assert not schema_exists(dialect.schema)
    cancelled = session.outcomes[-1]
    assert cancelled.actor == "T2" and cancelled.resumed and cancelled.sqlstate == "57014"


def test_a_repeatable_read_snapshot_is_not_moved_by_the_engine() -> None:
    """T1 reads its snapshot's rows after T2 commits: the engine ran nothing else inside T1's transaction."""
    text = (
        "T1: begin isolation level repeatable read\nT1: select * from test where id = 1\n"
        "T2: update test set value = 12 where id = 2\nT2: commit\nT1: select * from test\nT1: commit"
    )
    with Session(parse(text), PostgresDialect(conninfo(), "engine_rr")) as opened:
        opened.run_in_order()
    last_read = opened.outcomes[4]
    assert last_read.rows == [{"id": 1, "value": 10, "version": 1}, {"id": 2, "value": 20, "version": 1}]
    assert last_read.committed[1]["value"] == 12
    assert opened.outcomes[2].began == "read committed", "a begin-less actor's first statement began a transaction"


# -- a job stepped by hand through its controls ---------------------------------------------


def step(job: Job, actor: int, client: Client | None = None) -> None:
    """Ask for one actor's step as the job page does (its POST, or the helper its view calls)."""
    if client is not None:
        response = client.post(f"/jobs/{job.pk}/control/", {"action": "step", "actor": str(actor)})
        assert response.status_code in (202, 302), response.content
    else:
        job.request_control("step", actor=actor)


def wait_events(job: Job, count: int) -> list[Event]:
    return wait_for(lambda: (found := events(job)) and len(found) >= count and found, what=f"{count} events")


def test_a_job_stepped_by_hand_blocks_refuses_goes_on_replays_and_exports(signed_in: Client, alice: Any) -> None:
    job = create_job("step", {"script": "for-update-wait", "pace": "by hand"}, alice)
    runner = JobThread(job.pk)
    ran = runner.ran
    runner.start()
    try:
        wait_events(job, 2)  # both actors connected
        expected = 2
        for actor in (1, 2, 1, 2):  # T2's FOR UPDATE blocks behind T1's
            step(job, actor, signed_in)
            expected += 1
            wait_events(job, expected)
        assert events(job)[-1].kind == "blocked"
        step(job, 2)  # a second click on T2 while it waits
        refused = wait_for(
            lambda: JobControl.objects.filter(job=job, actor=2, applied_at__isnull=False).exclude(outcome="").first(),
            what="the refusal",
        )
        assert refused.outcome.startswith("T2 is blocked: its step on line 5")
        step(job, 1)  # T1 goes on while T2 waits
        wait_events(job, expected + 1)
        step(job, 1, signed_in)  # T1 commits: T2's read goes on by itself
        kinds = [event.kind for event in wait_events(job, expected + 3)]
        assert kinds[-3:] == ["write", "commit", "resumed"]
        step(job, 2)
        wait_events(job, expected + 4)
        step(job, 2)  # its last step: the job ends by itself
        runner.join(timeout=20)
        assert not runner.is_alive()
    finally:
        if runner.is_alive():
            Job(pk=job.pk).request_cancel()
            runner.join(timeout=20)
    (done,) = ran
    assert done.status == Job.Status.SUCCEEDED, done.error
    summary = done.summary or {}
    assert summary["final"] == {"1": 12, "2": 20} and summary["invariant_ok"]
    assert steps_at(done, 5)["blocked_by"] == ["T1"] and steps_at(done, 5)["then"] == "ok"
    assert sessions_left(f"{SCHEMA_PREFIX}{job.pk} ") == 0 and not schema_exists(f"{SCHEMA_PREFIX}{job.pk}")

    # Replay: the snapshot at the blocked step shows T2 waiting for T1, and the rows as each sees them.
    stored = events(done)
    blocked = next(event for event in stored if event.kind == "blocked")
    at_block = snapshot_at(done.pk, blocked.seq)
    assert at_block is not None
    shown = {actor["name"]: actor for actor in at_block["state"]["actors"]}
    assert shown["T2"]["status"] == "blocked" and shown["T2"]["waits_for"] == ["T1"]
    assert shown["T1"]["seen"] == [{"id": 1, "value": 10, "version": 1}]
    assert at_block["state"]["script"][3]["outcome"] == "blocked"
    assert at_block["state"]["script"][2]["rows"] == [{"id": 1, "value": 10, "version": 1}], "what T1's read returned"
    last = snapshot_at(done.pk, done.last_seq)
    assert last is not None and last["state"]["rows"][0] == {"id": 1, "value": 12, "version": 1}
    assert [actor["status"] for actor in last["state"]["actors"]] == ["done", "done"]
    assert last["figures"]["lock_waits"] == 1 and last["figures"]["steps_taken"] == 8
    assert signed_in.get(f"/jobs/{done.pk}/replay/").status_code == 200
    fragments = signed_in.get(f"/jobs/{done.pk}/fragments/?seq={blocked.seq}")
    assert fragments.status_code == 200
    assert "✓ 1=10" in fragments.content.decode(), "the read's cell shows the rows it returned"

    # Export: every event, each with its step, line and the rows after it.
    lines = b"".join(signed_in.get(f"/jobs/{done.pk}/export.jsonl").streaming_content).decode().splitlines()
    exported = [json.loads(line) for line in lines]
    assert [event["seq"] for event in exported] == [event.seq for event in stored]
    for event in exported:
        if event["kind"] != "ready":
            assert {"step", "line", "committed", "seen"} <= set(event["detail"]), event
    assert refused.outcome  # the refused click changed nothing: one blocked event, one resumed
    assert [event["kind"] for event in exported].count("resumed") == 1


# -- headless ----------------------------------------------------------------------------------


def test_runjob_step_json_runs_the_script_and_releases_everything(run_manage) -> None:  # type: ignore[no-untyped-def]
    result = run_manage("runjob", "step", "--script", "lost-update", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary.keys() >= {"steps", "final", "question", "invariant_ok", "invariant", "lost_updates", "pace"}
    assert summary["pace"] == "written order", "runjob runs a script by itself unless --pace says otherwise"
    assert summary["final"] == {"1": 11, "2": 20} and summary["question"] == BUILTINS["lost-update"].question
    first = summary["steps"][0]
    assert first.keys() >= {"actor", "step", "line", "outcome", "sqlstate", "message", "rows", "blocked_by"}
    assert (first["actor"], first["step"], first["line"], first["outcome"]) == ("T1", "begin", 2, "ok")
    schema = f"{SCHEMA_PREFIX}{summary['id']}"
    assert sessions_left(f"{schema} ") == 0
    assert not schema_exists(schema)
    assert Job.objects.get(pk=summary["id"]).summary == summary


def test_a_schema_left_by_a_job_that_died_is_dropped_by_the_next_step_job() -> None:
    running = create_job("step", {"script": "deadlock"})
    Job.objects.filter(pk=running.pk).update(status=Job.Status.RUNNING)
    left = [f"{SCHEMA_PREFIX}999999", f"{SCHEMA_PREFIX}{running.pk}", f"{SCHEMA_PREFIX}another_suite"]
    with connection.cursor() as cursor:
        for schema in left:
            cursor.execute(f"CREATE SCHEMA {schema}")
    run_step(script="lost-update")
    assert not schema_exists(left[0]), "no job 999999 runs: its schema was left behind"
    assert schema_exists(left[1]) and schema_exists(left[2]), "a running job's schema, and another session's, stay"
    with connection.cursor() as cursor:
        for schema in left[1:]:
            cursor.execute(f"DROP SCHEMA {schema}")


def start_by_hand(params: dict[str, Any], steps: tuple[int, ...]) -> tuple[Job, threading.Thread, list[Job]]:
    """A by-hand job running in a thread, stepped as `steps` say (actor numbers), each step reported before the next."""
    job = create_job("step", {"pace": "by hand", **params})
    runner = JobThread(job.pk)
    ran = runner.ran
    runner.start()
    count = len(parse(BUILTINS[params["script"]].text).actors)
    wait_events(job, count)
    for actor in steps:
        count += 1
        step(job, actor)
        wait_events(job, count)
    return job, runner, ran


def test_a_job_left_idle_ends_by_itself_and_releases_a_blocked_step(monkeypatch: pytest.MonkeyPatch) -> None:
    from occviz.scenarios.step import job as step_job

    monkeypatch.setattr(step_job, "IDLE_LIMIT_S", 1.0)
    _, runner, ran = start_by_hand({"script": "for-update-wait"}, (1, 2, 1, 2))
    runner.join(timeout=10)
    assert not runner.is_alive(), "the job ended after a second without a step"
    (done,) = ran
    summary = done.summary or {}
    assert done.status == Job.Status.SUCCEEDED and summary["stopped_by"] == "idle"
    assert summary["steps_not_run"] == 4 and "4 not run: idle" in summary["invariant"]
    cancelled = steps_at(done, 5)
    assert cancelled["outcome"] == "blocked" and cancelled["then"] == "error" and cancelled["sqlstate"] == "57014"
    assert summary["invariant_ok"] and summary["connections_released"] and summary["rows_dropped"]


def test_a_cancelled_job_with_a_blocked_step_releases_everything() -> None:
    job, runner, ran = start_by_hand({"script": "deadlock"}, (1, 2, 1, 2, 1))
    assert events(job)[-1].kind == "blocked"
    Job(pk=job.pk).request_cancel()
    runner.join(timeout=10)
    assert not runner.is_alive()
    (done,) = ran
    assert done.status == Job.Status.CANCELLED
    assert done.summary is not None and done.summary["invariant_ok"], done.summary
    assert sessions_left(f"{SCHEMA_PREFIX}{job.pk} ") == 0 and not schema_exists(f"{SCHEMA_PREFIX}{job.pk}")


def test_written_order_paces_its_steps() -> None:
    job = run_step(script="lost-update", step_ms=60)
    times = [event.t_ms for event in events(job) if event.kind != "ready"]
    assert len(times) == 8
    assert all(later - earlier >= 55 for earlier, later in itertools.pairwise(times))


def test_next_line_takes_the_script_in_its_written_order_and_waits_for_a_blocked_actor() -> None:
    text = "T1: begin\nT1: update test set value = 11 where id = 1\nT2: update test set value = 12 where id = 1\n"
    text += "T2: commit\nT1: commit\nT2: select * from test"
    with Session(parse(text), PostgresDialect(conninfo(), "engine_next")) as opened:
        assert [opened.advance_in_order().status for _ in range(3)] == ["ok", "ok", "blocked"]
        with pytest.raises(StepRefused, match=r"the next line, line 4, is T2's, and T2 is blocked: .* waits for T1"):
            opened.advance_in_order()
        assert opened.advance("T1").status == "ok", "T1's commit, taken out of order"
        assert opened.wait_idle("T2", 5.0)
        assert opened.advance_in_order().step.line == 4
        last = opened.advance_in_order()
        assert last.rows == [{"id": 1, "value": 12, "version": 1}, {"id": 2, "value": 20, "version": 1}]
        with pytest.raises(StepRefused, match="every line of the script has been taken"):
            opened.advance_in_order()


def test_a_job_stepped_line_by_line_from_its_page_ends_by_itself(signed_in: Client, alice: Any) -> None:
    job = create_job("step", {"script": "lost-update", "pace": "by hand"}, alice)
    runner = JobThread(job.pk)
    ran = runner.ran
    runner.start()
    try:
        wait_events(job, 2)
        for taken in range(1, 9):
            response = signed_in.post(f"/jobs/{job.pk}/control/", {"action": "next"})
            assert response.status_code in (202, 302), response.content
            wait_events(job, 2 + taken)
        runner.join(timeout=20)
    finally:
        if runner.is_alive():
            Job(pk=job.pk).request_cancel()
            runner.join(timeout=20)
    (done,) = ran
    assert done.status == Job.Status.SUCCEEDED and done.summary is not None
    assert [step["line"] for step in done.summary["steps"]] == list(range(2, 10))
    assert done.summary["final"] == {"1": 11, "2": 20} and done.summary["lost_updates"] == 1
