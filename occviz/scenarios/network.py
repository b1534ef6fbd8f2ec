"""A scenario's network latency: the form's two fields, their checks, the live control, its event, its words.

What a scenario declares to put its actors a network delay from PostgreSQL (the delay
itself is occviz.concurrency.latency's `Network`):

    class MyForm(ScenarioForm):
        latency_ms = latency_field("replica", "20 for every replica, 20 2=50 for replica-2 at 50")
        jitter_ms = jitter_field()

        def clean(self):
            data = super().clean()
            clean_network(self, data, data.get("replicas"), "replica", scenario.actor_name)
            return data

    class My(Scenario):
        list_params = ("latency_ms",)
        controls = (latency_control("replicas"),)
        kinds = (..., latency_changed_kind("replica"))
        compared = (..., *NETWORK_COMPARED)

and its job: `network = job_network(params, seed)`, `context.on_control(...)` handing "latency"
to `apply_latency_control`, each actor's connection through `network`, and the summary's
`"network": network.describe()`; in a shard of a job over several processes (its `shard_actors`),
`network = shard_network(context, seed)`, which the same control reaches.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from django import forms

from occviz.concurrency.latency import MAX_LATENCY_MS, Network, format_latencies, parse_latencies
from occviz.scenarios.base import Control, DecimalNumberField, EventKind

if TYPE_CHECKING:
    from occviz.jobs.context import JobContext

NETWORK_FIELDS = ("latency_ms", "jitter_ms")
"""The fields' names: a form's "Network" section."""
NETWORK_COMPARED = (
    ("network.latency_ms", "network latency, one way (ms)"),
    ("network.jitter_ms", "network jitter (ms)"),
)
"""The summary's network, side by side in compare."""
LATENCY_SETTING = "latency_ms"
"""The setting (occviz.jobs.shards) by which the live control's latency reaches a job's other processes."""


class LatencyField(forms.CharField):
    """`20 2=50` in one line of text; a number, or a list of words (the API's JSON), taken as that line."""

    def to_python(self, value: Any) -> str:
        if isinstance(value, list | tuple):
            value = " ".join(str(word) for word in value)
        return str(super().to_python(value))


def latency_field(noun: str, example: str) -> LatencyField:
    """The latency field: one number for every actor (`noun`), N=ms for some (`example` says how)."""
    return LatencyField(
        max_length=2000,
        required=False,
        initial="0",
        label="Network latency (ms)",
        help_text=f"Added one way to each {noun}'s connection to the database, both directions: {example}. "
        "0: no delay.",
    )


def jitter_field() -> DecimalNumberField:
    return DecimalNumberField(
        min_value=0,
        max_value=MAX_LATENCY_MS,
        required=False,
        initial=0,
        label="Jitter (ms)",
        help_text="Each chunk's delay varies within +/- this (in order: none overtakes another).",
    )


def clean_network(
    form: forms.Form, data: dict[str, Any], actors: int | None, noun: str, name: Callable[[int], str]
) -> None:
    """The latency as canonical text (`20 2=50`), each actor named one of the job's `actors`; jitter only with one.

    An actor may be named by its number or by its one-word name (`replica-2=50`, `admission-1=50`).
    """
    raw = str(data.get("latency_ms") or "0")
    # Names past the job's actors too, so that naming one the job has not is refused as such.
    aliases = {name(n).lower(): str(n) for n in range(1, (actors or 0) + 100) if " " not in name(n)}
    given: dict[str, str] = {}  # the word with a name as a number -> the word as written
    for word in raw.replace(",", " ").split():
        actor, equals, ms = word.partition("=")
        given[f"{aliases.get(actor.lower(), actor)}={ms}" if equals else word] = word
    try:
        everyone, by_actor = parse_latencies(" ".join(given), actors, noun)
    except ValueError as error:
        message = str(error)
        for word, written in given.items():
            message = message.replace(repr(word), repr(written))
        form.add_error("latency_ms", message)
        return
    data["latency_ms"] = format_latencies(everyone, by_actor)
    if data.get("jitter_ms") and not (everyone or any(by_actor.values())):
        form.add_error("jitter_ms", "Jitter varies a latency: give a latency too.")


def latency_control(nouns: str) -> Control:
    """The live page's "set latency": every actor's one-way delay from now on, typed in ms."""
    return Control(
        "latency",
        "set latency",
        f"Every {nouns.removesuffix('s')}'s one-way delay to the database from now on.",
        per_actor=False,
        seconds=(0.0, MAX_LATENCY_MS / 1000.0),
        unit="ms",
    )


def latency_changed_kind(nouns: str) -> EventKind:
    """The event the latency control records (actor 0: the job's, not one actor's)."""
    return EventKind(
        "latency_changed",
        "latency changed",
        (f"Every {nouns.removesuffix('s')} is now {{detail.latency_ms}} ms from the database, each way",),
        "#4a5568",
        "tick",
        captions=(
            f"The network between the {nouns} and the database now adds {{detail.latency_ms}} ms each way: "
            "every read and write waits a longer round trip, a wider window for another's write to land first.",
        ),
        key=True,
        plural="latency changes",
        singular="latency change",
    )


def job_network(params: Mapping[str, Any], seed: int, *, always: bool = False) -> Network:
    """The job's actors' roads to the database, as its parameters ask (close it when the actors have ended)."""
    return Network(str(params.get("latency_ms") or "0"), params.get("jitter_ms") or 0.0, seed=seed, always=always)


def shard_network(context: JobContext, seed: int) -> Network:
    """A shard's roads to the database: proxies of its own process, at the latency the job was launched with,
    then at each the live control sets; closed with the shard's context, once its actors have ended."""
    network = job_network(context.params, seed)
    weakref.finalize(context, network.close)
    assert context.shard is not None
    context.shard.follow(LATENCY_SETTING, network.set_latency)
    return network


def apply_latency_control(context: JobContext, network: Network, action: str, seconds: float | None) -> None:
    """The live control: every actor's one-way delay from now on (`seconds`, in s), recorded (ValueError if refused).

    In a job over several processes, each other process's actors have proxies of their own:
    the new latency is shared, and each shard applies it to its own (`shard_network`).
    """
    if action != "latency" or seconds is None:
        raise ValueError(f"unknown control {action!r}")
    network.set_latency(round(seconds * 1000.0, 3))
    if context.shard is not None:
        context.shard.share(LATENCY_SETTING, network.everyone)
    context.recorder.record(0, 0, 0, "latency_changed", detail={"latency_ms": network.everyone})


def network_setup(params: Mapping[str, Any]) -> str:
    """ ", latency 20 ms ± 5" for a job's one-line setup ("" without a latency)."""
    if str(params.get("latency_ms") or "0") == "0":
        return ""
    jitter = f" ± {params['jitter_ms']:g}" if params.get("jitter_ms") else ""
    return f", latency {params['latency_ms']} ms{jitter}"
