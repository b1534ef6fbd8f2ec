"""runjob: run a job headless, in this process, and print its summary.

    python manage.py runjob counter --writers 8 --increments 100 --strategy occ --json
    python manage.py runjob leader-election --preset slow-shutdown --seconds 10

Each scenario is a subcommand whose flags are its parameters form's fields (`--think-ms`
for `think_ms`): the form holds every default, limit and help text, and validates what
the flags say, so the same input gets the same error here as in the browser. `--preset NAME`
starts from one of the scenario's presets, as its button on the page does. The job is
recorded like any other (events, summary, admin), but no worker is needed: the actors
run as threads of this command (with `--processes N`, of N processes: this one and N - 1
`runshard` children, released together).

While the job runs, this process renews its heartbeat (`Job.runner` is `runjob:<host>:<pid>`).
Ctrl-C (SIGINT) or SIGTERM stops the actors within a second and records the job as
cancelled, with its summary; the command then exits with 128 + the signal's number. A
second Ctrl-C interrupts at once: the job is recorded as failed, or if even that is cut
short, ended by the reapers as any job whose runner died.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, cast

from django import forms
from django.core.management.base import BaseCommand, CommandError, CommandParser

from occviz.jobs.models import Job
from occviz.jobs.reaper import reap
from occviz.jobs.registry import ParamsError
from occviz.jobs.runner import run_job, runner_id, stop_all_jobs
from occviz.jobs.tasks import create_job
from occviz.management.schema import apply_migrations
from occviz.scenarios import SCENARIOS
from occviz.scenarios.base import Scenario


def _number(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse type that accepts ASCII digits only (int() would take '٣' as 3)."""

    def parse(raw: str) -> int | float:
        if not raw.isascii():
            raise ValueError(raw)
        return kind(raw)

    parse.__name__ = kind.__name__  # argparse says "invalid int value: 'four'"
    return parse


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_flags(parser: argparse.ArgumentParser, spec: Scenario) -> None:
    for name, field in spec.form_class.base_fields.items():
        help_text = str(field.help_text or field.label or name.replace("_", " "))
        if field.initial not in (None, "") and not isinstance(field, forms.BooleanField):
            help_text += f" (default {field.initial})"
        options: dict[str, Any] = {"dest": name, "help": help_text}
        if isinstance(field, forms.BooleanField):
            options["action"] = "store_true"
            options["default"] = None
        elif name in spec.list_params:
            options.update(nargs="+", action="extend", metavar=name.upper())
        elif isinstance(field, forms.ChoiceField):
            # The field keeps its choices as (value, label) pairs; the stubs type them as any accepted input.
            choices = cast("Iterable[tuple[Any, Any]]", field.choices)
            options["choices"] = [str(value) for value, _ in choices if value != ""]
        elif isinstance(field, forms.FloatField):  # before IntegerField: Django's FloatField is one
            options["type"] = _number(float)
        elif isinstance(field, forms.IntegerField):
            options["type"] = _number(int)
        # Required only where the form has no default (checked in `handle`: a preset may give it).
        parser.add_argument(_flag(name), **options)
    presets = ", ".join(preset.slug for preset in spec.presets) or "none"
    parser.add_argument(
        "--preset", metavar="NAME", help=f"start from a preset's parameters; flags given override them ({presets})"
    )
    parser.add_argument("--json", action="store_true", help="print only the summary, as one JSON object")
    if "processes" not in spec.form_class.base_fields:
        # Taken only to be refused in words (the job runs in one process): not an unknown flag.
        parser.add_argument("--processes", dest="processes", help="runs in one process for now", default=None)


class Command(BaseCommand):
    help = "Run a contention job headless and print its summary."

    def add_arguments(self, parser: CommandParser) -> None:
        subcommands = parser.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
        for spec in SCENARIOS.values():
            sub = subcommands.add_parser(
                spec.name, help=spec.description, called_from_command_line=parser.called_from_command_line
            )
            _add_flags(sub, spec)

    def handle(self, *args: Any, **options: Any) -> None:
        spec = SCENARIOS[options["scenario"]]
        data = _preset_params(spec, options.get("preset"))
        for name in spec.form_class.base_fields:
            value = options.get(name)
            if value is not None:
                data[name] = " ".join(map(str, value)) if name in spec.list_params else value
            elif name in spec.headless:
                data[name] = spec.headless[name]  # a preset's too: nobody can click here
        if options.get("processes") is not None and "processes" not in spec.form_class.base_fields:
            data["processes"] = options["processes"]  # refused by create_job, in words
        missing = [
            _flag(name)
            for name, field in spec.form_class.base_fields.items()
            if field.required and field.initial is None and name not in data
        ]
        if missing:
            raise CommandError(f"the following arguments are required: {', '.join(missing)}", returncode=2)
        apply_migrations()  # a new data folder's database is empty: runjob may be the first command run
        # A signal from here on cancels the job, even one not started yet (run_job then never begins it).
        with _stopped_by_signal() as stopped_by:
            try:
                job = create_job(spec.name, data)
            except ParamsError as error:
                flags = "; ".join(
                    f"{_flag(field)}: {' '.join(messages)}" if field != "__all__" else " ".join(messages)
                    for field, messages in error.errors.items()
                )
                raise CommandError(f"invalid job: {flags}", returncode=2) from None
            reap()  # this process notices dead runners too, as every occviz process does
            job = run_job(job.pk, runner=runner_id("runjob"), shards="children")
        if stopped_by:
            signum = stopped_by[0]
            if job.summary is not None:
                self.stdout.write(json.dumps(job.summary) if options["json"] else _readable(spec, job))
            raise CommandError(
                f"stopped by {signal.Signals(signum).name}: job {job.pk} is {job.status} "
                f"({job.last_seq} events recorded)",
                returncode=128 + signum,
            )
        if job.summary is None:
            raise CommandError(f"job {job.pk} failed:\n{job.error}")
        self.stdout.write(json.dumps(job.summary) if options["json"] else _readable(spec, job))
        if job.status == Job.Status.FAILED:
            raise CommandError(f"job {job.pk} failed:\n{job.error}")
        if not job.summary["invariant_ok"]:
            raise CommandError(f"job {job.pk}: invariant broken: {job.summary['invariant']}")


def _preset_params(spec: Scenario, slug: str | None) -> dict[str, Any]:
    """The named preset's parameters (the flags given then override them); a clear error for an unknown name."""
    if slug is None:
        return {}
    for preset in spec.presets:
        if preset.slug == slug:
            return dict(preset.params)
    names = ", ".join(preset.slug for preset in spec.presets)
    known = f"its presets are {names}" if names else "it has no presets"
    raise CommandError(f"unknown preset {slug!r} for {spec.name}: {known}", returncode=2)


@contextmanager
def _stopped_by_signal() -> Iterator[list[int]]:
    """While inside, SIGINT and SIGTERM stop the running job (as cancelled); yields the signals received.

    A second signal falls through to the default (KeyboardInterrupt, or termination).
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # call_command from a thread: no signals here
        yield received
        return
    previous = {signum: signal.getsignal(signum) or signal.SIG_DFL for signum in (signal.SIGINT, signal.SIGTERM)}

    def stop(signum: int, frame: object) -> None:
        received.append(signum)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        stop_all_jobs("cancelled")

    for signum in previous:
        signal.signal(signum, stop)
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _readable(spec: Scenario, job: Job) -> str:
    summary = job.summary or {}
    figures = []
    for figure in spec.figures:
        value = summary.get(figure.key)
        if isinstance(value, dict):
            value = " / ".join(f"{name} {amount}" for name, amount in value.items())
        if value is not None:
            figures.append(f"{figure.label} {value}")
    lines = [f"job {job.pk}: {spec.title} ({spec.setup(job.params)}): {job.status}"]
    line = " "
    for text in figures:
        if len(line) + len(text) > 100:
            lines.append(line)
            line = " "
        line += f" {text}."
    lines.append(line)
    lines.append(f"  {summary.get('duration_s')} s; invariant {'holds' if summary.get('invariant_ok') else 'BROKEN'}:")
    lines.append(f"  {summary.get('invariant')}")
    # A job over several processes: one line per shard, what it ran and where.
    shards = summary.get("shards") or []
    for shard in shards:
        first, last = shard["actors"]
        actors = f"{spec.actor_noun} {first}" if first == last else f"{spec.actor_noun}s {first}-{last}"
        lines.append(f"  shard {shard['index']} of {len(shards)}: {actors} in {shard['runner'] or 'no process'}")
    return "\n".join(lines)
