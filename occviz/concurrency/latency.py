"""Network latency per actor: each actor's connection through the job's proxy, a delay away from the server.

A job asks for it with a latency in ms, one way, for every actor (`20`) and optionally
for some of them (`20 2=50`: actor 2 at 50 ms, the others at 20; `2=50`: only actor 2),
and a jitter in ms. With any latency, every actor of the job connects through a proxy of
its own in the job's proxy process (occviz.concurrency.proxy), so that the latency can be
changed while the job runs, for all of them or for one; an actor at 0 then passes
straight through. With none (the default), the actors connect directly and no proxy runs.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from occviz.concurrency.proxy import DatabaseProxy, ProxyProcess

MAX_LATENCY_MS = 2000.0
"""The longest one-way delay (and jitter) a job may ask for: 2 s each way is already a far planet."""


def _ms(raw: str, what: str) -> float:
    """A number of ms from 0 to MAX_LATENCY_MS written in ASCII (ValueError says what is wrong)."""
    try:
        value = float(raw) if raw.isascii() else math.nan
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_LATENCY_MS:
        raise ValueError(f"{what} {raw!r}: give a number of ms from 0 to {MAX_LATENCY_MS:g}.")
    return value


def parse_latencies(text: str, actors: int | None = None, noun: str = "actor") -> tuple[float, dict[int, float]]:
    """`20 2=50` -> (20.0, {2: 50.0}): the latency of every actor, and of those named (ValueError if bad)."""
    everyone = 0.0
    given_everyone = False
    by_actor: dict[int, float] = {}
    for word in text.replace(",", " ").split():
        name, equals, raw = word.partition("=")
        if not equals:
            if given_everyone:
                raise ValueError(f"{word!r}: give one latency for every {noun}, and {noun}=ms for the others.")
            everyone, given_everyone = _ms(word, "latency"), True
            continue
        if not (name.isascii() and name.isdigit() and int(name) >= 1):
            raise ValueError(f"{word!r}: name a {noun} by its number, as in 2=50.")
        number = int(name)
        if actors is not None and number > actors:
            raise ValueError(f"{word!r}: the job has {actors} {noun}s.")
        if number in by_actor:
            raise ValueError(f"{word!r}: {noun} {number} is given twice.")
        by_actor[number] = _ms(raw, f"{noun} {number}'s latency")
    return everyone, by_actor


def format_latencies(everyone: float, by_actor: Mapping[int, float]) -> str:
    """The canonical text of a latency: `20`, or `20 2=50 3=0` (actors in order)."""
    return " ".join([f"{everyone:g}", *(f"{n}={ms:g}" for n, ms in sorted(by_actor.items()))])


def _upstream(using: str) -> tuple[str, int]:
    """The real server's host (a socket folder or a name) and port, for the proxies."""
    params = settings.DATABASES[using]
    return str(params.get("HOST") or ""), int(params.get("PORT") or 5432)


class Network:
    """A job's actors' roads to PostgreSQL: direct, or each through its proxy with its delay.

    `connection(n)` is what actor n's session adds to its connection parameters ({} when
    direct); `set_latency` changes the delay while the job runs (ValueError, and nothing
    changed, when the value is bad or the actors connect directly). Close it when the job ends.
    """

    def __init__(self, latency: str, jitter_ms: float = 0.0, *, seed: int = 0, using: str = "default") -> None:
        self.everyone, self.by_actor = parse_latencies(latency or "0")
        self.jitter_ms = float(jitter_ms or 0.0)
        self.seed = seed
        self.using = using
        self.proxied = bool(self.everyone or any(self.by_actor.values()))
        self._process: ProxyProcess | None = None
        self._proxies: dict[int, DatabaseProxy] = {}
        self._lock = threading.Lock()

    def delay_ms(self, number: int) -> float:
        return self.by_actor.get(number, self.everyone)

    def connection(self, number: int) -> dict[str, Any]:
        """Actor `number`'s connection overrides: its proxy's socket folder, or {} (direct)."""
        if not self.proxied:
            return {}
        with self._lock:
            if self._process is None:
                self._process = ProxyProcess(*_upstream(self.using))
            proxy = self._proxies.get(number)
            if proxy is None:
                proxy = self._proxies[number] = self._process.proxy(
                    f"actor-{number}",
                    delay_ms=self.delay_ms(number),
                    jitter_ms=self.jitter_ms,
                    seed=self.seed * 1_000 + number,
                )
        return proxy.connection

    def set_latency(self, delay_ms: float, actor: int | None = None) -> None:
        """Every actor's one-way delay (or `actor`'s) is `delay_ms` from now on."""
        if not self.proxied:
            raise ValueError(
                "this job's connections are direct (it was launched without a latency): launch it with a "
                "latency to change it while it runs"
            )
        if not 0 <= delay_ms <= MAX_LATENCY_MS:
            raise ValueError(f"latency {delay_ms:g} ms: give a number of ms from 0 to {MAX_LATENCY_MS:g}")
        with self._lock:
            if actor is None:
                self.everyone, self.by_actor = delay_ms, {}
            else:
                self.by_actor[actor] = delay_ms
            proxies = list(self._proxies.items())
        for number, proxy in proxies:
            if actor is None or number == actor:
                try:
                    proxy.slow(delay_ms)
                except RuntimeError as error:  # the proxy process is gone: the job is ending
                    raise ValueError(str(error)) from error

    def describe(self) -> dict[str, Any]:
        """What a summary says of the network: the latency and jitter asked for (or set last), in ms."""
        said: dict[str, Any] = {"latency_ms": self.everyone, "jitter_ms": self.jitter_ms, "proxied": self.proxied}
        if self.by_actor:
            said["latency_ms_by_actor"] = {str(n): ms for n, ms in sorted(self.by_actor.items())}
        return said

    def close(self) -> None:
        with self._lock:
            process, self._process = self._process, None
            self._proxies.clear()
        if process is not None:
            with contextlib.suppress(OSError):
                process.close()

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
