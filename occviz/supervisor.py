"""What keeps `serve` up: its child processes restarted with backoff, and one serve per data folder.

`Supervisor` runs the workers and the web server as children. One that exits without
being asked to is started again after a backoff (1 s, 2 s, 4 s... up to 30 s; back to
1 s once it has stayed up a minute), with a line in the log that counts the restarts.
`ServeLock` is an flock on the data folder's `serve.lock`, which names the addresses of
the serve that holds it (`manage.py kubeconfig` reads its HTTPS one there): the kernel drops
it with the process, however that process ends.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BACKOFF_FIRST_S = 1.0
BACKOFF_CAP_S = 30.0
# A child that stayed up this long before it stopped is started again after the first backoff, not the last.
STABLE_AFTER_S = 60.0

# Looked up here, not in the child: between fork and exec only async-signal-safe work is safe,
# and a dlopen() there could wait on a loader lock another thread held at the fork.
_prctl = ctypes.CDLL(None, use_errno=True).prctl
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: if serve is killed outright, the child gets SIGTERM instead of living on."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


@dataclass
class Child:
    """One supervised process: what starts it, and how its restarts have gone."""

    name: str
    argv: list[str]
    env: dict[str, str]
    pass_fds: tuple[int, ...] = ()
    """Descriptors it inherits, each start: the listening socket the web servers share."""
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = BACKOFF_FIRST_S
    restart_at: float | None = None  # set while it is down, waiting for its backoff

    def start(self) -> None:
        # A session of its own: Ctrl-C reaches only serve, which stops the children in order.
        self.process = subprocess.Popen(
            self.argv, env=self.env, pass_fds=self.pass_fds, start_new_session=True, preexec_fn=_die_with_parent
        )
        self.started_at = time.monotonic()
        self.restart_at = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Supervisor:
    """Starts its children, and starts again, after a backoff, any that stops while it tends them."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.children: list[Child] = []

    def add(self, name: str, argv: list[str], env: dict[str, str], pass_fds: tuple[int, ...] = ()) -> Child:
        child = Child(name, argv, env, pass_fds)
        self.children.append(child)
        return child

    def start(self) -> None:
        for child in self.children:
            child.start()

    def tend(self) -> None:
        """Notice the children that stopped, and start those whose backoff has passed. Call it often."""
        now = time.monotonic()
        for child in self.children:
            assert child.process is not None, "start() first"
            if child.restart_at is None:
                returncode = child.process.poll()
                if returncode is None:
                    continue
                up_s = now - child.started_at
                if up_s >= STABLE_AFTER_S:
                    child.backoff_s = BACKOFF_FIRST_S
                child.restart_at = now + child.backoff_s
                self.say(
                    f"{child.name} (pid {child.process.pid}) {describe_exit(returncode)} after {up_s:.1f} s: "
                    f"starting it again in {child.backoff_s:g} s"
                )
                child.backoff_s = min(child.backoff_s * 2, BACKOFF_CAP_S)
            elif now >= child.restart_at:
                child.start()
                child.restarts += 1
                self.say(f"{child.name} started again (pid {child.process.pid}), restart {child.restarts}; {self}")

    def stop(self, children: list[Child], grace_s: float) -> None:
        """SIGTERM to each of `children` still running; SIGKILL to any still running after `grace_s`."""
        running = [child.process for child in children if child.process is not None and child.running]
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in running:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"pid {process.pid} did not stop within {grace_s:g} s: killing it")
                process.kill()
                process.wait()

    def __str__(self) -> str:
        return "restarts: " + ", ".join(f"{child.name} {child.restarts}" for child in self.children)


class AlreadyServing(Exception):
    """Another serve holds the data folder; the message says where it listens."""


# A reader (`ServeLock.holder`) holds the lock, shared, for an instant: a serve that finds it
# taken tries again this many times, this far apart, before it takes it for another serve's.
ACQUIRE_ATTEMPTS = 5
ACQUIRE_RETRY_S = 0.02


def _lock_exclusively(fd: int) -> bool:
    """Whether this process now holds the exclusive flock on `fd`, tried ACQUIRE_ATTEMPTS times."""
    for attempt in range(ACQUIRE_ATTEMPTS):
        if attempt:
            time.sleep(ACQUIRE_RETRY_S)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        return True
    return False


@dataclass(frozen=True)
class ServeAddress:
    """Where a serve listens, as its lock file says it.

    The file's first line is `http://host:port/ (pid N)`, as it always was: a second serve's
    refusal quotes it, and readers of the file match that line as is. A serve with HTTPS
    adds a second line, its `https://host:port/`.
    """

    http: str
    pid: int
    https: str = ""

    def text(self) -> str:
        return f"{self.http} (pid {self.pid})\n" + (f"{self.https}\n" if self.https else "")

    @classmethod
    def parse(cls, text: str) -> ServeAddress | None:
        """The address `text()` wrote; None for anything else (a file cut short, say)."""
        found = re.fullmatch(r"(http://\S+) \(pid (\d+)\)\n(?:(https://\S+)\n)?", text)
        return cls(found[1], int(found[2]), found[3] or "") if found else None

    def __str__(self) -> str:
        first = f"{self.http} (pid {self.pid})"
        return f"{first}, {self.https}" if self.https else first


class ServeLock:
    """One serve per data folder: an exclusive flock on DATA_DIR/serve.lock, holding that serve's address.

    The lock belongs to the open file, which no child inherits (close-on-exec), and the
    kernel releases it when the process ends, even by SIGKILL: a stale file never blocks.
    """

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "serve.lock"
        self._fd: int | None = None

    def acquire(self, address: ServeAddress) -> None:
        """Hold the lock and record `address` in it; AlreadyServing, having changed nothing, if another holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if not _lock_exclusively(fd):
            text = os.pread(fd, 4096, 0).decode(errors="replace")
            os.close(fd)
            holder = ServeAddress.parse(text)
            # Empty: the holder took the lock a moment ago and has not written its address yet.
            raise AlreadyServing(str(holder) if holder else text.strip() or "starting up")
        os.ftruncate(fd, 0)
        os.pwrite(fd, address.text().encode(), 0)
        self._fd = fd

    def holder(self) -> ServeAddress | None:
        """The address of the serve that holds the lock now; None if none does (or it has not written it yet).

        A file left by a serve that ended is not held: what it says is not believed.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # let go of at once, when the file is closed
            except BlockingIOError:
                return ServeAddress.parse(os.pread(fd, 4096, 0).decode(errors="replace"))
            return None
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the last descriptor of the file drops the flock
            self._fd = None
