"""The floor under the engine's figure: writers that run the engine's two statements and nothing else.

    from occviz.bench.floor import floor_commits_per_s
    rate = floor_commits_per_s(row_id, writers=16, seconds=3, processes=2)

`bench --part engine` compares a job with pgbench. Part of the gap is occviz's own (recording
every step, stored snapshots, heartbeats, the publisher); part is what any Python client pays
on the machine: a thread per writer, a system call or two and a wake-up for every statement,
on the cores PostgreSQL needs too. The floor measures the second part alone. `writers` threads
over `processes` child processes (`python -m occviz.bench.floor`), each with its own
`PreparedSession`, run the occ writer's read and compare-and-swap (the same prepared SQL the
job runs and pgbench is given) on one row as fast as they can, with immediate retries, and
record nothing. The rate is the versions the row moved while they ran.

Every child connects first and says so; then all are released at once, so connecting is not
part of the run, as a job's barrier releases its shards. A child that fails says why on its
standard error, and the floor raises with it.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time

READY = "ready"
READY_TIMEOUT_S = 60.0


class FloorFailed(RuntimeError):
    """A child of the floor failed, or never said it was ready: the message has its standard error."""


def floor_commits_per_s(row_id: int, writers: int, seconds: float, processes: int = 1) -> float:
    """Commits a second of `writers` bare writers over `processes` processes on counter row `row_id`."""
    # Imported here: this module is also the children's program, which sets Django up first.
    from occviz.bench.streaming import current_database_url
    from occviz.pgbench import version_of

    processes = max(1, min(processes, writers))
    shares = [writers // processes + (1 if index < writers % processes else 0) for index in range(processes)]
    env = {**os.environ, "DATABASE_URL": current_database_url(), "DJANGO_SETTINGS_MODULE": "occviz.settings"}
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "occviz.bench.floor", str(row_id), str(share), str(seconds)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for share in shares
    ]
    try:
        for child in children:
            _wait_ready(child)
        before = version_of(row_id)
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children:
            _, err = child.communicate(timeout=seconds + READY_TIMEOUT_S)
            if child.returncode != 0:
                raise FloorFailed(f"a floor process failed (exit {child.returncode}): {err.strip()}")
        return (version_of(row_id) - before) / seconds
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


def _wait_ready(child: subprocess.Popen[str]) -> None:
    assert child.stdout is not None
    readable, _, _ = select.select([child.stdout], [], [], READY_TIMEOUT_S)
    if not readable or child.stdout.readline().strip() != READY:
        child.kill()
        _, err = child.communicate()
        raise FloorFailed(f"a floor process never said it was ready: {err.strip() or 'no message'}")


def _run(row_id: int, threads: int, seconds: float) -> None:
    """One child: `threads` sessions connected, then, once released, read + CAS until `seconds` are up."""
    import django

    django.setup()
    from occviz.scenarios.counter.actors import CHECKED, READ
    from occviz.store.session import PreparedSession

    sessions = [PreparedSession() for _ in range(threads)]
    print(READY, flush=True)
    sys.stdin.readline()
    deadline = time.perf_counter() + seconds
    failed: list[BaseException] = []

    def write(session: PreparedSession) -> None:
        try:
            while time.perf_counter() < deadline:
                found = session.one(READ, [row_id])
                if found is None:
                    raise LookupError(f"counter {row_id} is gone")
                value, version = found
                CHECKED.run(row_id, version, (value + 1,), cursor=session)
        except BaseException as error:
            failed.append(error)

    workers = [threading.Thread(target=write, args=(session,)) for session in sessions]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    for session in sessions:
        session.close()
    if failed:
        raise SystemExit(f"{len(failed)} of {threads} writers failed: {failed[0]!r}")


if __name__ == "__main__":
    _run(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
