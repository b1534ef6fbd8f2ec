"""A replica's own road to PostgreSQL: a small socket proxy that can be cut.

Each replica of a leader election connects through a proxy of its own: a Unix
socket in a temporary folder, named as PostgreSQL names its socket
(`.s.PGSQL.<port>`), so libpq connects to it with `host=<folder>` and the real
port number. Every connection accepted there is forwarded to the real server (its
Unix socket, or TCP host:port), one thread a connection.

Cutting the proxy closes every forwarded connection and drops new ones for a
while: the replica then meets real connection errors ("server closed the
connection unexpectedly") on its next statement and on every reconnect until the
cut ends. Closing the proxy does the same for good: that is what kills a replica's
connection from another thread (a Django connection may only be closed by the
thread that opened it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import socket
import tempfile
import threading
import time

logger = logging.getLogger(__name__)

# How often the accept loop looks whether it was closed.
_ACCEPT_POLL_S = 0.1
_CHUNK = 65536


def _upstream_address(host: str, port: int) -> tuple[int, str | tuple[str, int]]:
    """Where the real server listens: (address family, address) for `host` and `port` as libpq reads them."""
    if not host or host.startswith("/"):
        return socket.AF_UNIX, os.path.join(host or "/var/run/postgresql", f".s.PGSQL.{port}")
    return socket.AF_INET6 if ":" in host else socket.AF_INET, (host, port)


def _shutdown(sock: socket.socket) -> None:
    # Wakes a pump thread blocked in select() on this socket; the pump itself then closes it
    # (closing it from here could hand its descriptor to a new socket under the pump's feet).
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _close(sock: socket.socket) -> None:
    _shutdown(sock)
    with contextlib.suppress(OSError):
        sock.close()


class DatabaseProxy:
    """Forwards connections from `directory`/.s.PGSQL.<port> to the real server, until cut or closed."""

    def __init__(self, upstream_host: str, port: int, *, name: str = "replica") -> None:
        self.port = port
        self.name = name
        self._upstream = _upstream_address(upstream_host, port)
        self.directory = tempfile.mkdtemp(prefix=f"occviz-{name}-")
        self._path = os.path.join(self.directory, f".s.PGSQL.{port}")
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._cut_until = 0.0
        self._closed = threading.Event()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self._path)
        self._listener.listen(16)
        self._listener.settimeout(_ACCEPT_POLL_S)
        self._thread = threading.Thread(target=self._accept_loop, name=f"{name}-proxy", daemon=True)
        self._thread.start()

    @property
    def is_cut(self) -> bool:
        return time.monotonic() < self._cut_until or self._closed.is_set()

    def cut(self, seconds: float) -> None:
        """Close every forwarded connection now and drop new ones for `seconds`."""
        with self._lock:
            self._cut_until = max(self._cut_until, time.monotonic() + seconds)
            pairs = list(self._pairs)
        for client, upstream in pairs:
            _shutdown(client)
            _shutdown(upstream)

    def close(self) -> None:
        """Close every connection and the listener for good; remove the socket folder."""
        self._closed.set()
        self.cut(0)
        self._thread.join()
        with contextlib.suppress(OSError):
            self._listener.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closed.is_set():
                    return
                raise
            if self.is_cut:
                # Dropped before the startup message is answered: libpq reports the server
                # closed the connection unexpectedly, as it would on a broken network.
                _close(client)
                continue
            family, address = self._upstream
            upstream = socket.socket(family, socket.SOCK_STREAM)
            try:
                upstream.connect(address)
            except OSError as error:
                logger.warning("%s proxy: cannot reach the database at %s: %s", self.name, address, error)
                _close(upstream)
                _close(client)
                continue
            pair = (client, upstream)
            with self._lock:
                self._pairs.add(pair)
            threading.Thread(target=self._pump, args=(pair,), name=f"{self.name}-proxy-pump", daemon=True).start()
        with contextlib.suppress(OSError):
            self._listener.close()

    def _pump(self, pair: tuple[socket.socket, socket.socket]) -> None:
        client, upstream = pair
        other = {client: upstream, upstream: client}
        try:
            while True:
                readable, _, _ = select.select([client, upstream], [], [])
                for sock in readable:
                    data = sock.recv(_CHUNK)
                    if not data:
                        return
                    other[sock].sendall(data)
        except (OSError, ValueError):
            return  # cut or closed under us (ValueError: select() on a closed socket)
        finally:
            with self._lock:
                self._pairs.discard(pair)
            _close(client)
            _close(upstream)
