"""Actors on a hub (greenlets of one thread) wait on real PostgreSQL without holding up each other."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest

from occviz.concurrency.hub import Hub, current_hub
from occviz.store.models import Counter
from occviz.store.session import PreparedSession

pytestmark = pytest.mark.django_db(transaction=True)


def on_hub(hub: Hub, steps: list[str], name: str, body: Callable[[PreparedSession], None]) -> Callable[[], None]:
    """An actor with a session of its own on `hub`, noting when it starts and ends in `steps`."""

    def actor() -> None:
        session = PreparedSession(hub=current_hub())
        try:
            steps.append(f"{name} starts")
            body(session)
            steps.append(f"{name} ends")
        finally:
            session.close()

    return actor


def test_a_slow_statement_does_not_hold_up_the_other_actors() -> None:
    hub, steps = Hub(threading.Event()), []

    def slow(session: PreparedSession) -> None:
        session.one("SELECT pg_sleep(%s)", [0.5])

    def quick(session: PreparedSession) -> None:
        for n in range(20):
            assert session.one("SELECT %s::integer + 1", [n]) == (n + 1,)

    hub.run([on_hub(hub, steps, "slow", slow), on_hub(hub, steps, "quick", quick)])
    assert steps == ["slow starts", "quick starts", "quick ends", "slow ends"]


def test_a_row_lock_wait_lets_the_others_run_and_ends_when_the_holder_commits() -> None:
    row = Counter.objects.create(namespace="hub", name="locked")
    hub, steps = Hub(threading.Event()), []
    holding = threading.Event()

    def holder(session: PreparedSession) -> None:
        with session.transaction():
            session.one("SELECT value FROM store_counter WHERE id = %s FOR UPDATE", [row.pk])
            holding.set()
            assert hub.wait(0.4) is False  # slept the whole time: nobody stopped the hub
            session.one("UPDATE store_counter SET value = 7 WHERE id = %s RETURNING value", [row.pk])
            steps.append("holder commits")

    def waiter(session: PreparedSession) -> None:
        while not holding.is_set():
            hub.wait(0.01)
        (value,) = session.one("SELECT value FROM store_counter WHERE id = %s FOR UPDATE", [row.pk]) or (None,)
        steps.append(f"waiter read {value}")

    def bystander(session: PreparedSession) -> None:
        for _ in range(10):
            session.one("SELECT count(*) FROM store_counter", [])

    hub.run(
        [on_hub(hub, steps, name, body) for name, body in (("holder", holder), ("waiter", waiter), ("by", bystander))]
    )
    assert steps.index("by ends") < steps.index("holder commits") < steps.index("waiter read 7")


def test_a_failed_statement_raises_its_sqlstate_and_the_session_goes_on() -> None:
    hub, steps = Hub(threading.Event()), []
    seen: list[object] = []

    def failing(session: PreparedSession) -> None:
        with pytest.raises(psycopg.errors.DivisionByZero):
            session.one("SELECT 1 / %s::integer", [0])
        with pytest.raises(psycopg.errors.SerializationFailure):
            session.execute("DO $$ BEGIN RAISE EXCEPTION 'made up' USING ERRCODE = '40001'; END $$")
        seen.append(session.one("SELECT %s::text", ["still here"]))

    hub.run([on_hub(hub, steps, "failing", failing)])
    assert seen == [("still here",)]


def test_a_stop_wakes_every_sleeper_at_once() -> None:
    stop = threading.Event()
    hub = Hub(stop)
    woke: list[tuple[bool, float]] = []

    def sleeper() -> None:
        started = time.perf_counter()
        woke.append((hub.wait(30.0), time.perf_counter() - started))

    def stopper() -> None:
        hub.wait(0.05)
        stop.set()

    hub.run([sleeper, sleeper, stopper])
    assert [stopped for stopped, _ in woke] == [True, True]
    assert all(waited < 5.0 for _, waited in woke)  # told at the stop, not at the end of their 30 s


def test_the_barrier_releases_all_at_once_or_hands_each_the_refusal() -> None:
    hub, steps = Hub(threading.Event()), []

    def actor(name: str) -> Callable[[], None]:
        def run() -> None:
            steps.append(f"{name} ready")
            hub.gather()
            steps.append(f"{name} runs")

        return run

    hub.run([actor("a"), actor("b"), actor("c")], ready=lambda: steps.append("released"))
    assert steps[:4] == ["a ready", "b ready", "c ready", "released"]
    assert sorted(steps[4:]) == ["a runs", "b runs", "c runs"]

    refused: list[str] = []

    def refusing() -> None:
        raise threading.BrokenBarrierError

    def gathering() -> None:
        try:
            hub_two.gather()
        except threading.BrokenBarrierError:
            refused.append("refused")

    hub_two = Hub(threading.Event())
    hub_two.run([gathering, gathering], ready=refusing)
    assert refused == ["refused", "refused"]
