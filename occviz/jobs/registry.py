"""What the job runner is handed: the programs it can run, and who observes each job.

The runner knows no scenario and no websocket. Scenarios register themselves as
programs (`occviz.scenarios`, when the app loads), the live stream registers its
publisher as an observer (`occviz.live`), and a test can register a program of its
own. Everything the runner needs of a program is `clean()` and `run()`, and what it shows
after each stored batch (`figures`, `read_state()`: stored as the batch's snapshot); a
launch also asks it for `connections()`, and the admin lists events by the `kinds` programs declare
and jobs with their `tag()`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from occviz.jobs.context import JobContext
    from occviz.jobs.figures import Figure
    from occviz.jobs.models import Job
    from occviz.jobs.recorder import Columns
    from occviz.jobs.snapshots import State


class ParamsError(Exception):
    """Invalid job parameters: `errors` maps each field to its messages."""

    def __init__(self, errors: Mapping[str, list[str]]) -> None:
        self.errors = dict(errors)
        super().__init__("; ".join(f"{field}: {' '.join(messages)}" for field, messages in self.errors.items()))


class NamedKind(Protocol):
    """One kind of event a program records."""

    @property
    def name(self) -> str: ...


class JobProgram(Protocol):
    """A kind of job: validates its parameters and runs its actors."""

    name: str

    @property
    def figures(self) -> Sequence[Figure]:
        """What a viewer of its jobs is shown as numbers, counted from the events as they are stored."""
        ...

    @property
    def kinds(self) -> Sequence[NamedKind]:
        """The kinds of event its jobs record."""
        ...

    def clean(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """The cleaned parameters, or ParamsError."""
        ...

    def run(self, context: JobContext) -> dict[str, Any]:
        """Run the job's actors and return its summary, with `invariant_ok` and `invariant`."""
        ...

    def connections(self, params: Mapping[str, Any]) -> int:
        """How many database connections its actors open, for the cleaned `params` (the launch budget)."""
        ...

    def read_state(self, job_id: int, params: Mapping[str, Any]) -> State:
        """Its job's contended objects as they are now: called in the runner's process after each stored batch."""
        ...

    def tag(self, params: Mapping[str, Any]) -> str:
        """A short label telling a job with these parameters apart from others of its kind ("occ"), or ""."""
        ...


class JobObserver(Protocol):
    """Told about one job as it runs: each stored batch of events, and its end."""

    def stored(self, seq_from: int, seq_to: int, columns: Columns) -> None: ...

    def ended(self, job: Job) -> None: ...


ObserverFactory = Callable[["Job"], JobObserver]

_programs: dict[str, JobProgram] = {}
_observers: list[ObserverFactory] = []


def register_program(program: JobProgram) -> None:
    _programs[program.name] = program


def unregister_program(name: str) -> None:
    _programs.pop(name, None)


def program(name: str) -> JobProgram:
    try:
        return _programs[name]
    except KeyError:
        known = ", ".join(sorted(_programs)) or "none"
        raise LookupError(f"no scenario named {name!r} (known: {known})") from None


def programs() -> dict[str, JobProgram]:
    return dict(_programs)


def add_observer(factory: ObserverFactory) -> None:
    """`factory(job)` is called when each job starts; the observer it returns follows that job."""
    if factory not in _observers:
        _observers.append(factory)


def observers_for(job: Job) -> list[JobObserver]:
    return [factory(job) for factory in _observers]
