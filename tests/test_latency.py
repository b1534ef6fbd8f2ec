"""Network latency per actor: the job's socket proxy adds a one-way delay (and jitter) to an actor's connection.

The proxy is measured for what it says it adds (a trivial query's round trip within 5 ms of
twice the setting, the median of several), and a counter race whose writers each sit 20 ms
from the server meets more conflicts than the same race without: the round trip between a
writer's read and its compare-and-swap is a window for the others' writes.
"""

from __future__ import annotations

import statistics
import time

import pytest
from django.db import connection

from occviz.concurrency.proxy import ProxyProcess
from occviz.store.session import PreparedSession

pytestmark = pytest.mark.django_db(transaction=True)


def _upstream() -> tuple[str, int]:
    params = connection.settings_dict
    return str(params["HOST"] or ""), int(params["PORT"] or 5432)


def _round_trips_ms(session: PreparedSession, count: int = 9) -> list[float]:
    session.one("SELECT 1", [])  # prepared before the clock starts
    taken = []
    for _ in range(count):
        started = time.perf_counter()
        session.one("SELECT 1", [])
        taken.append((time.perf_counter() - started) * 1000.0)
    return taken


@pytest.mark.parametrize("delay_ms", [0.0, 10.0, 20.0])
def test_the_proxy_adds_twice_its_one_way_delay_to_a_round_trip(delay_ms: float) -> None:
    with ProxyProcess(*_upstream()) as proxies:
        proxy = proxies.proxy("writer-1", delay_ms=delay_ms)
        session = PreparedSession(**proxy.connection)
        try:
            median = statistics.median(_round_trips_ms(session))
        finally:
            session.close()
    assert abs(median - 2 * delay_ms) <= 5.0, (delay_ms, median)
