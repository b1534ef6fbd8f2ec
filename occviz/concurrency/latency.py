"""Network latency per actor: each actor's connection through the job's proxy, a delay away from the server.

A job asks for it with a latency in ms, one way, for every actor (`20`) and optionally
for some of them (`20 2=50`: actor 2 at 50 ms, the others at 20; `2=50`: only actor 2),
and a jitter in ms. With any latency, every actor of the job connects through a proxy of
its own in the job's proxy process (occviz.concurrency.proxy), so that the latency can be
changed while the job runs, for all of them or for one; an actor at 0 then passes
straight through. With none (the default), the actors connect directly and no proxy runs,
unless the job routes them through proxies anyway (a leader election's replicas, which its
"cut off" control needs): then a latency is only the delay their proxies add.

An actor's connection is its own session (`connection(n)`: PreparedSession's overrides),
or this thread's Django connection (`routed(n)`, for actors that run Django's ORM).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from django.conf import settings
from django.db import connections

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
            article = "an" if noun[:1] in ("a", "e", "i", "o", "u") else "a"
            raise ValueError(f"{word!r}: name {article} {noun} by its number, as in 2=50.")
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
    direct), `routed(n)` routes this thread's Django connection the same way, `proxy(n)` is
    actor n's proxy itself (`always`: every actor has one, even at no latency); `set_latency`
    changes the delay while the job runs (ValueError, and nothing changed, when the value is
    bad or the actors connect directly). Close it when the job ends.
    """

    def __init__(
        self, latency: str, jitter_ms: float = 0.0, *, seed: int = 0, using: str = "default", always: bool = False
    ) -> None:
        self.everyone, self.by_actor = parse_latencies(latency or "0")
        self.jitter_ms = float(jitter_ms or 0.0)
        self.seed = seed
        self.using = using
        self.proxied = always or bool(self.everyone or any(self.by_actor.values()))
        self._process: ProxyProcess | None = None
        self._proxies: dict[int, DatabaseProxy] = {}
        self._closed = False
        self._lock = threading.Lock()

    def delay_ms(self, number: int) -> float:
        return self.by_actor.get(number, self.everyone)

    def proxy(self, number: int, name: str = "") -> DatabaseProxy:
        """Actor `number`'s proxy at its delay, opened at the first call (named `name`, else actor-N)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the job's network is closed: its actors have ended")
            if self._process is None:
                self._process = ProxyProcess(*_upstream(self.using))
            proxy = self._proxies.get(number)
            if proxy is None or proxy.closed:
                proxy = self._proxies[number] = self._process.proxy(
                    name or f"actor-{number}",
                    delay_ms=self.delay_ms(number),
                    jitter_ms=self.jitter_ms,
                    seed=self.seed * 1_000 + number,
                )
        return proxy

    def connection(self, number: int) -> dict[str, Any]:
        """Actor `number`'s connection overrides: its proxy's socket folder, or {} (direct)."""
        return self.proxy(number).connection if self.proxied else {}

    @contextlib.contextmanager
    def routed(self, number: int) -> Iterator[None]:
        """Inside, this thread's Django connection goes through actor `number`'s proxy (as is when direct).

        The thread's connection is closed on the way in and out, so the ORM's next query
        connects through the proxy inside, and as configured after. A job's actor threads
        are not pooled (only the web server's connections are), so the connection is its own.
        """
        overrides = self.connection(number)
        if not overrides:
            yield
            return
        wrapper = connections[self.using]
        wrapper.close()
        configured = wrapper.settings_dict
        # This thread's wrapper only: the settings stay as they are for every other thread.
        wrapper.settings_dict = {**configured, "HOST": overrides["host"], "PORT": str(overrides["port"])}
        try:
            yield
        finally:
            wrapper.close()
            wrapper.settings_dict = configured

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
            if (actor is None or number == actor) and not proxy.closed:  # closed: its actor has ended
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
            self._closed = True
            process, self._process = self._process, None
            self._proxies.clear()
        if process is not None:
            with contextlib.suppress(OSError):
                process.close()

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
