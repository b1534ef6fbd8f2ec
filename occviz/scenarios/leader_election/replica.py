"""Replicas in processes of their own: killed with SIGKILL, paused with SIGSTOP, as real ones would be.

`ReplicaProcess` is a replica as the job's process sees it: a child process running one
`LeaderElector` on a connection through the replica's proxy, exactly as a thread of the
job would. The children come from a fork server (`ReplicaSpawner`, one per process and
database, kept for the next elections): a process started with the job's interpreter and
Django settings, which sets Django up once and forks a replica per request, so that a
replica starts in milliseconds rather than the second Django takes to start (a replica
added while the job runs joins at once; sixteen start as fast as three; an election after
the first one starts no Django at all). The fork server is single-threaded and never connects
to the database: each replica opens its own connection after the fork.

A replica and the job's process talk over two pipes, handed to the fork server with the
request (SCM_RIGHTS) and inherited by the replica:

- commands, as JSON lines: `go` once every replica is connected, `stop` (graceful: it
  releases with ReleaseOnCancel), `skew`, `starve` and `end`;
- JSON lines back: `ready` once it is connected, each step it records (`e`, recorded by
  the job's one recorder in the order they arrive), and each change of what it believes
  (`s`: leading, its token, the Lease it last saw and when that runs out, whether it
  sleeps until its next round).

The job's process keeps that belief as a mirror the live state and the controls read.
Kill is SIGKILL: the replica dies wherever it is, its connection drops as a crash drops
it, nothing is released; its pipe reaching its end says every line it wrote has been
read, and only then is `killed` recorded. Pause is SIGSTOP (at a moment the replica
sleeps between two rounds, as a collector stops a program at a safepoint), then SIGCONT
after the pause's seconds: it wakes still believing it leads, writes with its old token,
and the fencing rejects the write. Cut off stays the proxy's. Signals go through a pidfd,
so none can reach another process that reused a dead replica's pid.

Nothing outlives the job's process: the fork server asks the kernel for SIGKILL when the
thread that started it ends (PR_SET_PDEATHSIG; a thread that lasts as long as the process),
each replica likewise when the fork server ends, and a replica also ends when its command
pipe closes or its election ends it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import queue
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

from occviz.concurrency.writer import Record
from occviz.scenarios.leader_election.elector import Habits, LeaderElectionConfig, LeaderElector, Ready, identity
from occviz.scenarios.leader_election.proxy import DatabaseProxy

logger = logging.getLogger(__name__)

START_TIMEOUT_S: Final = 120.0
"""How long the fork server may take to start Django, and a replica to connect, before the job gives up."""
IDLE_MARGIN_S: Final = 0.02
"""A pause waits for the replica to sleep at least this much longer before it stops it (see `pause`)."""
EXIT_TIMEOUT_S: Final = 10.0
"""How long an ended replica may take to release and exit before it is killed."""

_PR_SET_PDEATHSIG: Final = 1
_PR_SET_NAME: Final = 15
_MIRRORED: Final = frozenset({"leading", "token", "pending_starve", "idle_until", "observed_holder", "observed_expiry"})
_PROJECT: Final = str(Path(__file__).resolve().parents[3])  # the folder `occviz` is in
# The fork server's first lines, before Django: SIGKILL from the kernel when the thread that
# started it ends (PR_SET_PDEATHSIG is 1; if that thread is already gone, exit), and Ctrl-C in a
# terminal left to the job's process (it reaches the whole process group; the job ends its
# replicas itself). Then Django, then `serve`.
_BOOT: Final = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
if os.getppid() != int(sys.argv[2]):
    os._exit(1)
signal.signal(signal.SIGINT, signal.SIG_IGN)
import django
django.setup()
from occviz.scenarios.leader_election.replica import serve
serve(int(sys.argv[1]))
"""


def database_url(using: str = "default") -> str:
    """A DATABASE_URL for the alias' database as this process reaches it (the test database in tests)."""
    from django.db import connections

    params = connections[using].settings_dict
    user = quote(str(params.get("USER") or ""), safe="")
    password = quote(str(params.get("PASSWORD") or ""), safe="")
    credentials = f"{user}:{password}@" if password else f"{user}@"
    host, port, name = str(params.get("HOST") or ""), str(params.get("PORT") or ""), quote(str(params["NAME"]))
    if host.startswith("/") or not host:
        # A socket folder: the host in the query, the port (it names the socket) in the address.
        folder = f"?host={quote(host, safe='/')}" if host else ""
        return f"postgresql://{credentials}{':' + port if port else ''}/{name}{folder}"
    return f"postgresql://{credentials}{host}{':' + port if port else ''}/{name}"


def _child_environment(using: str) -> dict[str, str]:
    from django.conf import settings

    environment = dict(os.environ)
    # The module this process' settings came from (configured in code, as some tools do: the project's).
    module = getattr(settings, "SETTINGS_MODULE", None) or os.environ.get("DJANGO_SETTINGS_MODULE") or "occviz.settings"
    environment["DJANGO_SETTINGS_MODULE"] = module
    environment["DATABASE_URL"] = database_url(using)  # the database this process uses, not the one by default
    environment["OCCVIZ_PROCESS"] = "replica"
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [_PROJECT, environment.get("PYTHONPATH")]))
    return environment


def _readable(fd: int, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for `fd` to be readable (poll: any fd number, unlike select)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


def process_state(pid: int) -> str:
    """The process' state letter in /proc/<pid>/stat (R, S, T stopped, Z zombie...); '' once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2]


# -- in the job's process -----------------------------------------------------------------------------


class ReplicaSpawner:
    """A fork server: `spawn(setup)` starts a replica process, its pid and pipes returned.

    Get one with `fork_server(using)`: each process keeps one per database (and environment),
    started by a thread that lives as long as the process, so that the kernel ends it with the
    process and every election after the first starts its replicas at once.
    """

    def __init__(self, environment: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(theirs.fileno()), str(os.getpid())],
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                env=environment,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._socket = ours
        self._socket.settimeout(START_TIMEOUT_S)
        self._lock = threading.Lock()
        self.pid = self._process.pid

    def alive(self) -> bool:
        return self._process.poll() is None

    def spawn(self, setup: dict[str, Any]) -> tuple[int, int, int]:
        """A new replica process: (its pid, the write end of its commands, the read end of its lines)."""
        commands_read, commands_write = os.pipe()
        lines_read, lines_write = os.pipe()
        try:
            with self._lock:
                socket.send_fds(self._socket, [json.dumps(setup).encode()], [commands_read, lines_write])
                answer = self._socket.recv(4096)
        except OSError as error:
            for fd in (commands_write, lines_read):
                os.close(fd)
            raise RuntimeError(f"the replicas' fork server (process {self.pid}) is gone: {error}") from error
        finally:
            os.close(commands_read)  # the replica's now: each pipe ends when the replica does
            os.close(lines_write)
        if not answer:
            for fd in (commands_write, lines_read):
                os.close(fd)
            raise RuntimeError(f"the replicas' fork server exited ({self._process.poll()})")
        return int(json.loads(answer)["pid"]), commands_write, lines_read


class _ForkServers:
    """This process' fork servers, one per child environment, each started by the keeper thread.

    The kernel ends a fork server when the thread that started it ends (PR_SET_PDEATHSIG): the
    keeper is a thread that never ends, so they live as long as this process, and no longer.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._servers: dict[tuple[tuple[str, str], ...], ReplicaSpawner] = {}
        self._requests: queue.SimpleQueue[tuple[dict[str, str], Future[ReplicaSpawner]]] | None = None

    def get(self, using: str) -> ReplicaSpawner:
        environment = _child_environment(using)
        key = tuple(sorted(environment.items()))
        with self._lock:
            server = self._servers.get(key)
            if server is None or not server.alive():
                server = self._servers[key] = self._start(environment)
            return server

    def _start(self, environment: dict[str, str]) -> ReplicaSpawner:
        if self._requests is None:
            self._requests = queue.SimpleQueue()
            threading.Thread(target=self._keep, args=(self._requests,), name="occviz-forks", daemon=True).start()
        started: Future[ReplicaSpawner] = Future()
        self._requests.put((environment, started))
        return started.result()

    @staticmethod
    def _keep(requests: queue.SimpleQueue[tuple[dict[str, str], Future[ReplicaSpawner]]]) -> None:
        while True:
            environment, started = requests.get()
            try:
                started.set_result(ReplicaSpawner(environment))
            except BaseException as error:
                started.set_exception(error)

    def forget(self) -> None:
        """In a forked child: the parent's servers and keeper are not this process' (it starts its own)."""
        self._lock = threading.Lock()
        self._servers = {}
        self._requests = None


_fork_servers = _ForkServers()
os.register_at_fork(after_in_child=_fork_servers.forget)


def fork_server(using: str = "default") -> ReplicaSpawner:
    """This process' fork server of replicas on `using`'s database, started on first use."""
    return _fork_servers.get(using)


class ReplicaProcess:
    """One replica in a process of its own, seen from the job: its controls, and a mirror of what it believes.

    It has what `LeaderElection` and the live state read of a `LeaderElector` (number,
    identity, leading, token, killed, stopped, paused, the Lease it last saw) and its
    controls, which raise ValueError as the elector's do. `run(ready)` is the replica's
    actor: start the process, wait until it is connected, `ready()`, then follow it to its end.
    """

    def __init__(
        self,
        number: int,
        *,
        lease_id: int,
        counter_id: int,
        config: LeaderElectionConfig,
        habits: Habits,
        rng_seed: int,
        record: Record,
        end: threading.Event,
        proxies: Callable[[str], DatabaseProxy],
        spawner: Callable[[], ReplicaSpawner],
        using: str = "default",
        on_started: Callable[[], None] = lambda: None,
    ) -> None:
        self.number = number
        self.identity = identity(number)
        self.config = config
        self.habits = habits
        self._setup = {
            "number": number,
            "lease_id": lease_id,
            "counter_id": counter_id,
            "config": asdict(config),
            "habits": asdict(habits),
            "rng_seed": rng_seed,
            "using": using,
        }
        self._record_event = record
        self._end = end
        self._proxies = proxies
        self._spawner = spawner
        self._on_started = on_started
        self.proxy: DatabaseProxy | None = None
        self.pid: int | None = None
        # The mirror of the replica's beliefs, from its lines.
        self.leading = False
        self.token: int | None = None
        self.observed_holder: str | None = None
        self.observed_expiry: float | None = None  # time.monotonic(): one clock for every process of the machine
        self.idle_until: float | None = None
        self.pending_starve: float | None = None
        self.clock_offset_s = 0.0
        self.op = 0
        # What the job did to it, and how it ended.
        self.killed = False
        self.stop_requested = False
        self.finished = False
        self.paused = False
        self.failure = ""
        self._pidfd = -1
        self._commands = -1  # the write end of its command pipe
        self._lines = -1  # the read end of the pipe it writes its lines to
        self._buffer = b""
        self._ready = False
        self._eof = threading.Event()
        self._pipe_lock = threading.Lock()  # reading its lines and updating the mirror
        self._control_lock = threading.RLock()  # one control at a time, none while it starts or ends
        self._resume: threading.Timer | None = None
        self._ended = False

    # -- the actor ------------------------------------------------------------------------------

    def run(self, ready: Ready) -> None:
        """Start the process, wait until it is connected, `ready()`, then follow it until it exits."""
        try:
            with self._control_lock:
                if self.killed or self._end.is_set():
                    return  # killed (or the job ended) before it started: nothing to start
                self.proxy = self._proxies(self.identity)
                self._start()
            self._follow(until_ready=True)
            ready()
            self._on_started()
            self._send(op="go")
            self._follow()
            self._died()
        finally:
            self._finish()
        if self.failure:
            raise RuntimeError(f"{self.identity} (process {self.pid}) failed: {self.failure}")

    def _start(self) -> None:
        assert self.proxy is not None
        setup = {**self._setup, "proxy": {"directory": self.proxy.directory, "port": self.proxy.port}}
        pid, self._commands, self._lines = self._spawner().spawn(setup)
        os.set_blocking(self._lines, False)
        self.pid = pid
        with contextlib.suppress(OSError):  # gone already (its pipe says so), or a kernel without pidfds
            self._pidfd = os.pidfd_open(pid)
        logger.info("%s runs as process %s", self.identity, pid)

    def _follow(self, *, until_ready: bool = False) -> None:
        """Read the replica's lines as they come until it exits (or, `until_ready`, until it is connected)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._eof.is_set():
            if until_ready:
                if self._ready:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{self.identity} (process {self.pid}): not connected after {START_TIMEOUT_S:g} s"
                    )
            _readable(self._lines, 0.1)
            self._caught_up()
        if until_ready and not self._ready:
            raise RuntimeError(
                f"{self.identity} (process {self.pid}) exited before it connected: {self.failure or 'no reason given'}"
            )

    def _caught_up(self) -> None:
        """Read every line the replica has written so far: the mirror says what it believes now."""
        with self._pipe_lock:
            if self._eof.is_set() or self._lines < 0:
                return
            while True:
                try:
                    data = os.read(self._lines, 65536)
                except BlockingIOError:
                    return
                if not data:
                    self._eof.set()
                    return
                self._buffer += data
                *lines, self._buffer = self._buffer.split(b"\n")
                for line in lines:
                    self._handle(json.loads(line))

    def _handle(self, message: dict[str, Any]) -> None:
        if "e" in message:
            op, attempt, kind, row, fields = message["e"]
            self.op = op
            self._record_event(self.number, op, attempt, kind, row, **fields)
        elif "s" in message:
            for name, value in message["s"].items():
                if name in _MIRRORED:
                    setattr(self, name, value)
        elif "ready" in message:
            self._ready = True
        elif "refused" in message:
            refused = message["refused"]
            if refused["control"] == "starve":
                self.pending_starve = None
            self._record_control("control_failed", detail=refused)
        elif "fail" in message:
            self.failure = message["fail"]

    def _died(self) -> None:
        """Its lines ended, and nobody here ended it: its process died (`kill -9` from a shell, the OOM killer)."""
        with self._control_lock:
            if self.killed or self.stop_requested or self._ended or self.failure:
                return
            self.killed = True
            detail = {"leading": self.leading, "pid": self.pid, "outside": True}
            self._record_control("killed", detail=detail)
            logger.warning("%s: process %s died, killed from outside the job", self.identity, self.pid)
        if self.proxy is not None:
            with contextlib.suppress(RuntimeError):
                self.proxy.cut(None)

    def _finish(self) -> None:
        """End the process if it still runs, wait until it is gone, close the pipes and the proxy."""
        with self._control_lock:
            if self._resume is not None:
                self._resume.cancel()
            if not self._ended:
                self._ended = True
                self._send(op="end")
                if self.paused:
                    self._signal(signal.SIGCONT)
            if self._commands >= 0:
                os.close(self._commands)  # a replica that missed `end` reads the end of its commands
                self._commands = -1
        if self.pid is not None and not self._exited(EXIT_TIMEOUT_S):
            logger.warning("%s (process %s) did not exit: killed", self.identity, self.pid)
            self._signal(signal.SIGKILL)
            self._exited(EXIT_TIMEOUT_S)
        self._caught_up()  # anything it wrote on its way out
        with self._control_lock, self._pipe_lock:
            for fd in (self._lines, self._pidfd):
                if fd >= 0:
                    os.close(fd)
            self._lines = self._pidfd = -1
            self._eof.set()
            self.finished = True
            self.leading = False
            self.paused = False
        if self.proxy is not None:
            self.proxy.close()

    def _send(self, **command: Any) -> None:
        """One command line to the replica; one that has exited misses it, which is what exiting means."""
        if self._commands < 0:
            return
        data = json.dumps(command).encode() + b"\n"
        with contextlib.suppress(OSError):  # BrokenPipeError: it has exited
            while data:
                data = data[os.write(self._commands, data) :]

    def _exited(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the process to be gone."""
        if self._pidfd >= 0:
            return _readable(self._pidfd, timeout_s)  # a pidfd reads as ready once its process has exited
        deadline = time.monotonic() + timeout_s
        while self.pid is not None and process_state(self.pid) not in ("", "Z"):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def _signal(self, signum: signal.Signals) -> None:
        """Send `signum` to the replica's process, and never to another that took its pid (through its pidfd)."""
        with contextlib.suppress(ProcessLookupError):
            if self._pidfd >= 0:
                signal.pidfd_send_signal(self._pidfd, signum)
            elif self.pid is not None and not self.finished:
                os.kill(self.pid, signum)  # no pidfds in this kernel: the pid, while the replica is ours

    def _record_control(self, kind: str, **fields: Any) -> None:
        self._record_event(self.number, self.op, 0, kind, **fields)

    # -- the end --------------------------------------------------------------------------------

    def wake(self) -> None:
        """Called when the election ends (and when another replica failed): end it, continuing it if paused."""
        if not self._end.is_set():
            return
        with self._control_lock:
            if self._resume is not None:
                self._resume.cancel()
            if self.pid is None or self._ended:
                return
            self._ended = True
            # The command first: on waking, the replica reads it before it takes another step.
            self._send(op="end")
            if self.paused:
                self.paused = False
                self._signal(signal.SIGCONT)

    # -- the controls ---------------------------------------------------------------------------

    def _running(self) -> int:
        if self.pid is None:
            raise ValueError(f"{self.identity} has not started yet")
        return self.pid

    def kill(self) -> None:
        """SIGKILL: it dies wherever it is, its connection drops, nothing is released."""
        with self._control_lock:
            self.killed = True
            if self._resume is not None:
                self._resume.cancel()
            pid = self.pid
            if pid is None:
                # Killed before its process started (an added replica, a moment after it was added).
                self._record_control("killed", detail={"leading": False})
                return
            self._signal(signal.SIGKILL)
            # Its pipe ends with it: every line it wrote before it died is read (and recorded) first.
            deadline = time.monotonic() + EXIT_TIMEOUT_S
            while not self._eof.is_set() and self._lines >= 0 and time.monotonic() < deadline:
                _readable(self._lines, 0.05)
                self._caught_up()
            self.paused = False
            leading = self.leading
            self._record_control("killed", detail={"leading": leading, "pid": pid, "signal": signal.SIGKILL.name})
            logger.info("%s: process %s killed with SIGKILL (leading: %s)", self.identity, pid, leading)
        if self.proxy is not None:
            with contextlib.suppress(RuntimeError):  # no proxy process left: nothing to drop
                self.proxy.cut(None)

    def request_stop(self) -> None:
        """A graceful stop, as a message: it stops renewing and releases the lease with ReleaseOnCancel."""
        with self._control_lock:
            pid = self._running()
            self._caught_up()
            self._record_control("stopped", detail={"leading": self.leading, "pid": pid})
            self.stop_requested = True
            self._send(op="stop")

    def pause(self, seconds: float) -> None:
        """SIGSTOP now, SIGCONT `seconds` later: a real stop-the-world pause of the whole process.

        The stop lands while the replica sleeps between two rounds (it says when it sleeps,
        and until when), so that it wakes where a long GC pause leaves a program: about to
        act on what it believed before. One that never sleeps within a few rounds is stopped
        wherever it is.
        """
        with self._control_lock:
            pid = self._running()
            if self.paused:
                raise ValueError(f"{self.identity} is already paused")
            deadline = time.monotonic() + max(1.0, 3 * (1.0 + 1.2) * self.config.retry_period)
            while True:
                self._caught_up()
                if self._eof.is_set():
                    raise ValueError(f"{self.identity} has ended")
                with self._pipe_lock:  # no line of it is taken in until the signal is sent
                    now = time.monotonic()
                    idle = self.idle_until is not None and self.idle_until - now >= IDLE_MARGIN_S
                    if idle or now >= deadline:
                        self._signal(signal.SIGSTOP)
                        break
                time.sleep(0.002)
            # Stopped for real: /proc says T (proc(5)).
            stopped_by = time.monotonic() + 2.0
            while process_state(pid) not in ("T", "t", "Z", "") and time.monotonic() < stopped_by:
                time.sleep(0.001)
            self._caught_up()  # a line it wrote just before the stop
            self.paused = True
            leading = self.leading
            detail = {"seconds": seconds, "leading": leading, "pid": pid, "signal": signal.SIGSTOP.name}
            self._record_control("paused", detail=detail)
            logger.info("%s: process %s stopped with SIGSTOP for %g s", self.identity, pid, seconds)
            self._resume = threading.Timer(seconds, self._continue, [seconds])
            self._resume.daemon = True
            self._resume.start()

    def _continue(self, seconds: float) -> None:
        """SIGCONT after a pause; `woke` said first, with what it still believes."""
        with self._control_lock:
            if self.pid is None or not self.paused or self.killed or self._ended:
                return
            if not self.stop_requested:
                woke: dict[str, Any] = {"seconds": seconds, "believes_leader": self.leading, "pid": self.pid}
                if self.leading:
                    woke["token"] = self.token
                self._record_control("woke", detail=woke)
            self.paused = False
            self._signal(signal.SIGCONT)

    def cut_off(self, seconds: float) -> None:
        with self._control_lock:
            if self.proxy is None:
                raise ValueError(f"{self.identity} has not connected yet")
            self._caught_up()
            self._record_control("cut_off", detail={"seconds": seconds, "leading": self.leading, "pid": self.pid})
            self.proxy.cut(seconds)

    def starve(self, seconds: float) -> None:
        with self._control_lock:
            self._running()
            self._caught_up()
            if self.pending_starve is not None:
                raise ValueError(f"{self.identity} is already starved")
            if not self.leading:
                raise ValueError(f"{self.identity} does not lead: only a leader's renewals can be starved")
            self.pending_starve = seconds
            self._send(op="starve", seconds=seconds)

    def skew(self, seconds: float) -> None:
        with self._control_lock:
            pid = self._running()
            self.clock_offset_s = seconds
            detail: dict[str, Any] = {"seconds": seconds}
            if seconds:
                detail["ahead_s" if seconds > 0 else "behind_s"] = abs(seconds)
            self._record_control("skewed", detail={**detail, "pid": pid})
            self._send(op="skew", seconds=seconds)


# -- in the fork server and the replicas ---------------------------------------------------------------


def _prctl(option: int, value: int | bytes) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def serve(socket_fd: int) -> None:
    """The fork server (Django set up by _BOOT): a replica per request, until the job's process closes the socket."""
    server = socket.socket(fileno=socket_fd)
    _prctl(_PR_SET_NAME, b"occviz-forks")  # as `ps` names it; its replicas call themselves replica-N
    # Its replicas are reaped by the kernel as they exit: the job watches them through their pidfds.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    me = os.getpid()
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(server, 65536, 2)
        except OSError:
            break
        if not message:
            break  # the job's process is done with it (or gone)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                server.close()
                _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() != me:
                    os._exit(1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                setup = json.loads(message)
                _prctl(_PR_SET_NAME, identity(setup["number"]).encode())  # as `ps` and `top` name it
                code = replica_main(setup, fds[0], fds[1])
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)  # not Python's teardown of Django's modules: nothing is left to close
        for fd in fds:
            os.close(fd)
        server.send(json.dumps({"pid": pid}).encode())
    os._exit(0)


class _Lines:
    """A replica's end of its line pipe: one JSON line per write, whole, from any thread."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, separators=(",", ":"), default=str).encode() + b"\n"
        with self._lock:
            while data:
                data = data[os.write(self._fd, data) :]


# The elector's attributes the job's process mirrors, by the name the mirror gives them.
_WATCHED: Final = {
    "leading": "leading",
    "token": "token",
    "_pending_starve": "pending_starve",
    "idle_until": "idle_until",
}


class _ReportingElector(LeaderElector):
    """A LeaderElector that tells the job's process each change of what it believes, and when it sleeps."""

    idle_until: float | None = None
    _lines: _Lines | None = None
    _commands: _Commands | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        key = _WATCHED.get(name)
        if key is not None and self._lines is not None:
            self._lines.send({"s": {key: value}})

    def _observe(self, record: Any) -> None:
        super()._observe(record)
        if self._lines is not None:
            expiry = self.observed_time + self.lease_duration_of(record)
            self._lines.send({"s": {"observed_holder": record.holder_identity, "observed_expiry": expiry}})

    def _wait(self, seconds: float) -> bool:
        self.idle_until = time.monotonic() + seconds
        try:
            return super()._wait(seconds)
        finally:
            self.idle_until = None

    def _sleep_until(self, moment: float) -> bool:
        self.idle_until = moment
        try:
            return super()._sleep_until(moment)
        finally:
            self.idle_until = None

    def _done(self) -> bool:
        # Commands already written are taken before each step: one sent before a SIGCONT
        # (the job's end) is seen before the step the replica was about to take.
        if self._commands is not None:
            self._commands.take()
        return super()._done()


class _Commands:
    """The job's commands, taken by a thread of their own and before each step of the elector."""

    def __init__(self, fd: int, lines: _Lines) -> None:
        self._fd = fd
        os.set_blocking(fd, False)
        self._lines = lines
        self._buffer = b""
        self._lock = threading.Lock()
        self.go = threading.Event()
        self.end = threading.Event()
        self.elector: LeaderElector | None = None

    def follow(self) -> None:
        while not self.end.is_set():
            _readable(self._fd, 1.0)
            self.take()

    def take(self) -> None:
        """Act on every command written so far."""
        with self._lock:
            while not self.end.is_set():
                try:
                    data = os.read(self._fd, 65536)
                except BlockingIOError:
                    break
                if not data:  # the job's process is gone, or done with this replica
                    self._end()
                    break
                self._buffer += data
            *lines, self._buffer = self._buffer.split(b"\n")
            for line in lines:
                self._act(json.loads(line))

    def _end(self) -> None:
        self.end.set()
        self.go.set()
        if self.elector is not None:
            self.elector.wake()

    def _act(self, command: dict[str, Any]) -> None:
        op, elector = command.get("op"), self.elector
        if op == "go":
            self.go.set()
        elif op == "end":
            self._end()
        elif elector is None:
            return
        elif op == "stop":
            elector.stop_requested = True
            elector.wake()
        elif op == "skew":
            elector.clock_offset_s = float(command["seconds"])
        elif op == "starve":
            try:
                elector.starve(float(command["seconds"]))
            except ValueError as refused:
                self._lines.send({"refused": {"control": "starve", "error": str(refused)}})


class _Road(DatabaseProxy):
    """The replica's proxy as the replica sees it: a folder and a port to connect to; cutting it is the job's."""

    def __init__(self, directory: str, port: int) -> None:  # no proxy process in this one
        self.name, self.directory, self.port, self._cut_until = "", directory, port, 0.0

    def close(self) -> None:
        pass


def replica_main(setup: dict[str, Any], commands_fd: int, lines_fd: int) -> int:
    """A replica (forked by `serve`): connect through its proxy, say ready, elect from `go` until the end."""
    lines = _Lines(lines_fd)
    commands = _Commands(commands_fd, lines)
    try:
        road = _Road(setup["proxy"]["directory"], int(setup["proxy"]["port"]))

        def record(actor: int, op: int, attempt: int, kind: str, row: int | None = None, **fields: Any) -> None:
            lines.send({"e": [op, attempt, kind, row, fields]})

        def ready() -> None:
            lines.send({"ready": os.getpid()})
            commands.go.wait()

        elector = _ReportingElector(
            setup["number"],
            lease_id=setup["lease_id"],
            counter_id=setup["counter_id"],
            config=LeaderElectionConfig(**setup["config"]),
            habits=Habits(**setup["habits"]),
            record=record,
            end=commands.end,
            rng=random.Random(setup["rng_seed"]),
            proxies=lambda name: road,
            using=setup["using"],
        )
        commands.elector = elector
        elector._lines, elector._commands = lines, commands
        threading.Thread(target=commands.follow, name="commands", daemon=True).start()
        elector.run(ready)
    except BaseException as error:
        logger.exception("%s failed", identity(setup["number"]))
        text = str(error).strip()
        with contextlib.suppress(OSError):
            lines.send({"fail": f"{type(error).__name__}: {(text.splitlines() or [''])[0][:200]}"})
        return 1
    return 0
