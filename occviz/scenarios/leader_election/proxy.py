"""Each replica's own road to PostgreSQL: a socket proxy that can be cut, in a process of its own.

Every replica of a leader election connects through a proxy of its own: a Unix
socket in a temporary folder, named as PostgreSQL names its socket
(`.s.PGSQL.<port>`), so libpq connects to it with `host=<folder>` and the real
port number. Every connection accepted there is forwarded to the real server (its
Unix socket, or TCP host:port).

Cutting a proxy closes every connection it forwards and drops new ones for a
while: the replica then meets real connection errors ("server closed the
connection unexpectedly") on its next statement and on every reconnect until the
cut ends. Cutting it for good is how a killed replica's connection drops at once,
whatever its thread is doing.

The forwarding runs in a child process (one per election, asyncio, this file run
as a script), not in threads of the job's process: some libpq calls hold the
interpreter lock while they wait for the server (psycopg's describe_prepared, for
one), and a proxy thread needing that lock to pass the answer on would never get
it. The child takes commands as JSON lines on its stdin and answers each with one
line; it exits when its stdin closes, so it never outlives the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any

# -- in the job's process ---------------------------------------------------------------------------


class ProxyProcess:
    """The child process that forwards every replica's connections; `proxy(name)` opens one replica's."""

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

    def proxy(self, name: str) -> DatabaseProxy:
        """A new proxy for replica `name`: connect to its `directory` with the real port."""
        answer = self.request(op="open", name=name)
        return DatabaseProxy(self, name, answer["directory"], self.port)

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
    """One replica's proxy: connect with host=`directory`, port=`port`; cut it, close it."""

    def __init__(self, process: ProxyProcess, name: str, directory: str, port: int) -> None:
        self.process = process
        self.name = name
        self.directory = directory
        self.port = port
        self._cut_until = 0.0

    @property
    def is_cut(self) -> bool:
        return time.monotonic() < self._cut_until

    def cut(self, seconds: float | None) -> None:
        """Close every forwarded connection now and drop new ones for `seconds` (None: for good)."""
        until = float("inf") if seconds is None else time.monotonic() + seconds
        self._cut_until = max(self._cut_until, until)
        self.process.request(op="cut", name=self.name, seconds=seconds)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.process.request(op="close", name=self.name)


# -- in the child process ----------------------------------------------------------------------------


class _Proxy:
    """One replica's listener, and the connections it forwards."""

    def __init__(self, name: str, upstream_host: str, port: int) -> None:
        self.name = name
        self.upstream_host = upstream_host
        self.port = port
        self.directory = tempfile.mkdtemp(prefix=f"occviz-{name}-")
        self.cut_until = 0.0
        self.transports: set[asyncio.WriteTransport] = set()
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        path = os.path.join(self.directory, f".s.PGSQL.{self.port}")
        self.server = await asyncio.start_unix_server(self._forward, path=path)

    def cut(self, seconds: float | None) -> None:
        self.cut_until = float("inf") if seconds is None else max(self.cut_until, time.monotonic() + seconds)
        for transport in list(self.transports):
            transport.abort()

    async def close(self) -> None:
        self.cut(None)
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
        try:
            pumps = [
                asyncio.create_task(_pump(client_reader, upstream_writer)),
                asyncio.create_task(_pump(upstream_reader, client_writer)),
            ]
            # Either side closing (or a cut aborting both) ends the pair.
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for pump in pumps:
                pump.cancel()
        finally:
            self.transports -= transports
            for transport in transports:
                transport.abort()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()


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
                    proxy = proxies[name] = _Proxy(name, upstream_host, port)
                    await proxy.start()
                    answer["directory"] = proxy.directory
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
