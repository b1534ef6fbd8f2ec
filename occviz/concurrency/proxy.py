"""An actor's own road to PostgreSQL: a socket proxy that can be cut or slowed, in a process of its own.

An actor that connects through a proxy (a leader-election replica always does; a counter
race's writer when the job asks for network latency) has one of its own: a Unix socket in
a temporary folder, named as PostgreSQL names its socket (`.s.PGSQL.<port>`), so libpq
connects to it with `host=<folder>` and the real port number. Every connection accepted
there is forwarded to the real server (its Unix socket, or TCP host:port).

Cutting a proxy closes every connection it forwards and drops new ones for a while: the
actor then meets real connection errors ("server closed the connection unexpectedly") on
its next statement and on every reconnect until the cut ends. Cutting it for good is how
a killed replica's connection drops at once, whatever its thread is doing.

Slowing a proxy adds a one-way delay to every chunk of bytes it forwards, in each
direction, as a network far from the server would: a statement reaches the server
`delay` later, and its answer comes back `delay` later again, so a round trip grows by
twice the delay. Jitter varies each chunk's delay uniformly within +/- jitter (never below
zero), but a chunk never overtakes an earlier one of its direction: it waits for it, as
TCP would deliver them. A new delay applies to the chunks that arrive from then on,
on the connections already open too.

The forwarding runs in a child process (one per job, asyncio, this file run as a
script), not in threads of the job's process: some libpq calls hold the interpreter lock
while they wait for the server (psycopg's describe_prepared, for one), and a proxy thread
needing that lock to pass the answer on would never get it. The child takes commands as
JSON lines on its stdin and answers each with one line; it exits when its stdin closes,
so it never outlives the job. It imports nothing of occviz (it runs with `python -I`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any

# -- in the job's process ---------------------------------------------------------------------------


class ProxyProcess:
    """The child process that forwards the actors' connections; `proxy(name)` opens one actor's."""

    def __init__(self, upstream_host: str, port: int) -> None:
        self.port = port
        self._lock = threading.Lock()
        # -I: no environment, user site or script folder (this folder's modules) on the path.
        self._process = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), upstream_host, str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    @property
    def pid(self) -> int:
        return self._process.pid

    def request(self, **command: Any) -> dict[str, Any]:
        """Send one command to the child and return its answer (RuntimeError if it failed)."""
        with self._lock:
            stdin, stdout = self._pipes()
            try:
                stdin.write(json.dumps(command) + "\n")
                stdin.flush()
                line = stdout.readline()
            except (BrokenPipeError, ValueError) as error:
                raise RuntimeError(f"the database proxy process is gone: {error}") from error
        if not line:
            raise RuntimeError(f"the database proxy process exited ({self._process.poll()})")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"database proxy: {answer['error']}")
        return answer

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self._process.stdin is not None and self._process.stdout is not None
        return self._process.stdin, self._process.stdout

    def proxy(self, name: str, *, delay_ms: float = 0.0, jitter_ms: float = 0.0, seed: int = 0) -> DatabaseProxy:
        """A new proxy for actor `name` (one-way `delay_ms` +/- `jitter_ms`): connect to its `directory`."""
        answer = self.request(op="open", name=name, delay_ms=delay_ms, jitter_ms=jitter_ms, seed=seed)
        return DatabaseProxy(self, name, answer["directory"], self.port, delay_ms, jitter_ms)

    def close(self) -> None:
        """End the child (it closes every proxy and removes their folders)."""
        with self._lock:
            stdin, _ = self._pipes()
            with contextlib.suppress(OSError, ValueError):
                stdin.close()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        with contextlib.suppress(OSError, ValueError):
            self._pipes()[1].close()

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DatabaseProxy:
    """One actor's proxy: connect with host=`directory`, port=`port`; slow it, cut it, close it."""

    def __init__(
        self, process: ProxyProcess, name: str, directory: str, port: int, delay_ms: float = 0.0, jitter_ms: float = 0.0
    ) -> None:
        self.process = process
        self.name = name
        self.directory = directory
        self.port = port
        self.delay_ms = delay_ms
        self.jitter_ms = jitter_ms
        self.closed = False
        self._cut_until = 0.0

    @property
    def connection(self) -> dict[str, Any]:
        """The libpq parameters that route a connection through this proxy (PreparedSession's overrides)."""
        return {"host": self.directory, "port": self.port}

    @property
    def is_cut(self) -> bool:
        return time.monotonic() < self._cut_until

    def cut(self, seconds: float | None) -> None:
        """Close every forwarded connection now and drop new ones for `seconds` (None: for good)."""
        until = float("inf") if seconds is None else time.monotonic() + seconds
        self._cut_until = max(self._cut_until, until)
        self.process.request(op="cut", name=self.name, seconds=seconds)

    def slow(self, delay_ms: float, jitter_ms: float | None = None) -> None:
        """Delay every chunk from now on by `delay_ms` each way (+/- `jitter_ms`; None keeps the jitter)."""
        jitter = self.jitter_ms if jitter_ms is None else jitter_ms
        self.process.request(op="slow", name=self.name, delay_ms=delay_ms, jitter_ms=jitter)
        self.delay_ms, self.jitter_ms = delay_ms, jitter

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(RuntimeError):
            self.process.request(op="close", name=self.name)


# -- in the child process ----------------------------------------------------------------------------


class _Proxy:
    """One actor's listener, the delay it adds, and the connections it forwards."""

    def __init__(self, name: str, upstream_host: str, port: int, delay_ms: float, jitter_ms: float, seed: int) -> None:
        self.name = name
        self.upstream_host = upstream_host
        self.port = port
        self.directory = tempfile.mkdtemp(prefix=f"occviz-{name}-")
        self.cut_until = 0.0
        self.delay_s = 0.0
        self.jitter_s = 0.0
        self.slow(delay_ms, jitter_ms)
        self.rng = random.Random(seed)
        self.transports: set[asyncio.WriteTransport] = set()
        self.forwarding: set[asyncio.Task[None]] = set()
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        path = os.path.join(self.directory, f".s.PGSQL.{self.port}")
        self.server = await asyncio.start_unix_server(self._forward, path=path)

    def slow(self, delay_ms: float, jitter_ms: float) -> None:
        if not (0 <= delay_ms < 1e6 and 0 <= jitter_ms < 1e6):
            raise ValueError(f"delay {delay_ms!r} ms, jitter {jitter_ms!r} ms: give numbers of ms from 0")
        self.delay_s, self.jitter_s = delay_ms / 1000.0, jitter_ms / 1000.0

    def delay(self) -> float:
        """This chunk's one-way delay in seconds: the delay, +/- up to the jitter, never below zero."""
        if not self.jitter_s:
            return self.delay_s
        return max(0.0, self.delay_s + self.rng.uniform(-self.jitter_s, self.jitter_s))

    def cut(self, seconds: float | None) -> None:
        self.cut_until = float("inf") if seconds is None else max(self.cut_until, time.monotonic() + seconds)
        for transport in list(self.transports):
            transport.abort()

    async def close(self) -> None:
        self.cut(None)
        if self.forwarding:  # ended by the cut: let them finish rather than be cancelled at exit
            await asyncio.wait(self.forwarding, timeout=1.0)
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        shutil.rmtree(self.directory, ignore_errors=True)

    async def _upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if not self.upstream_host or self.upstream_host.startswith("/"):
            folder = self.upstream_host or "/var/run/postgresql"
            return await asyncio.open_unix_connection(os.path.join(folder, f".s.PGSQL.{self.port}"))
        return await asyncio.open_connection(self.upstream_host, self.port)

    async def _forward(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if time.monotonic() < self.cut_until:
            # Dropped before the startup message is answered: libpq reports that the server
            # closed the connection unexpectedly, as it would over a broken network.
            client_writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await self._upstream()
        except OSError as error:
            print(f"{self.name} proxy: cannot reach the database: {error}", file=sys.stderr)
            client_writer.transport.abort()
            return
        transports = {client_writer.transport, upstream_writer.transport}
        self.transports |= transports
        task = asyncio.current_task()
        if task is not None:
            self.forwarding.add(task)
        try:
            pumps = [
                asyncio.create_task(self._pump(client_reader, upstream_writer)),
                asyncio.create_task(self._pump(upstream_reader, client_writer)),
            ]
            # Either side closing (or a cut aborting both) ends the pair.
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for pump in pumps:
                pump.cancel()
        finally:
            self.forwarding.discard(task)
            self.transports -= transports
            for transport in transports:
                transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One direction: each chunk read is written once its delay is up, in the order read."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        in_flight = 0  # chunks read and not yet written

        async def deliver() -> None:
            nonlocal in_flight
            while (chunk := await chunks.get()) is not None:
                due, data = chunk
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
                in_flight -= 1

        delivering = asyncio.create_task(deliver())
        last_due = 0.0
        try:
            with contextlib.suppress(OSError):
                while data := await reader.read(65536):
                    if delivering.done():
                        break  # the other end is gone
                    delay = self.delay()
                    if not delay and not in_flight:
                        writer.write(data)  # no delay and nothing ahead of it: straight through
                        await writer.drain()
                        continue
                    # Never before an earlier chunk of this direction: no overtaking.
                    last_due = max(loop.time() + delay, last_due)
                    in_flight += 1
                    chunks.put_nowait((last_due, data))
                # The end of the stream comes after what was read before it (unless cut: then at once).
                if not writer.transport.is_closing():
                    chunks.put_nowait(None)
                    await asyncio.wait([delivering])
        finally:
            delivering.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await delivering


async def _serve(upstream_host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    proxies: dict[str, _Proxy] = {}
    try:
        while line := await commands.readline():
            command = json.loads(line)
            answer: dict[str, Any] = {}
            try:
                name = command["name"]
                if command["op"] == "open":
                    if name in proxies:
                        raise ValueError(f"a proxy named {name!r} is open already")
                    proxy = _Proxy(
                        name,
                        upstream_host,
                        port,
                        float(command.get("delay_ms") or 0.0),
                        float(command.get("jitter_ms") or 0.0),
                        int(command.get("seed") or 0),
                    )
                    proxies[name] = proxy
                    await proxy.start()
                    answer["directory"] = proxy.directory
                elif command["op"] == "slow":
                    proxies[name].slow(float(command["delay_ms"]), float(command["jitter_ms"]))
                elif command["op"] == "cut":
                    proxies[name].cut(command["seconds"])
                elif command["op"] == "close":
                    await proxies.pop(name).close()
            except Exception as error:
                answer = {"error": f"{type(error).__name__}: {error}"}
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
    finally:
        for proxy in proxies.values():
            await proxy.close()


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1], int(sys.argv[2])))
