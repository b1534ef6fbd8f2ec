"""The dashboard's pages and the JSON endpoints its scripts read. Every page needs a signed-in user."""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from django import forms
from django.contrib.auth.decorators import login_required
from django.contrib.staticfiles import finders
from django.core.handlers.asgi import ASGIRequest
from django.http import (
    FileResponse,
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseBase,
    HttpResponseForbidden,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST, require_safe
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails

from occviz.jobs import events
from occviz.jobs.models import Job, JobControl, JobNotRunning
from occviz.jobs.reaper import end_if_stale
from occviz.jobs.registry import ParamsError
from occviz.jobs.snapshots import snapshot_or_empty
from occviz.jobs.tasks import LaunchRefused, launch
from occviz.live import fragments
from occviz.live.jobstate import job_state
from occviz.scenarios import SCENARIOS
from occviz.scenarios.base import Scenario
from occviz.store import kinds as object_kinds
from occviz.web import watch
from occviz.web.shard_table import shard_table
from occviz.web.yaml_text import yaml_text

RECENT_JOBS = 15
FAVICON = "occviz/favicon.ico"
MAX_COMPARE = 6


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def _json_login_required(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """For endpoints read by scripts: a 401 in JSON, not a redirect to a sign-in page."""

    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not request.user.is_authenticated:
            return JsonResponse({"error": "Sign in first."}, status=401)
        return view(request, *args, **kwargs)

    wrapped.__name__ = view.__name__
    wrapped.__doc__ = view.__doc__
    return wrapped


def _spec(job: Job) -> Scenario | None:
    return SCENARIOS.get(job.scenario)


def _tag(job: Job) -> str:
    """Its scenario's short label for it ("occ"), or "": the tag beside its title."""
    spec = _spec(job)
    return spec.tag(job.params) if spec else ""


def _with_setup(jobs: Any) -> list[Job]:
    """The jobs, each with `setup` (one line from its scenario saying what it does), `tag` (its
    scenario's short label for it, "occ") and `alarms` (its alarming figures above zero, "3 lost
    updates", shown in red beside the verdict)."""
    listed = list(jobs)
    for job in listed:
        spec = _spec(job)
        job.setup = spec.setup(job.params) if spec else ""
        job.tag = _tag(job)
        job.alarms = spec.alarms(job.summary) if spec else []
    return listed


JOB_FILTERS = ("mine", "all")


def _jobs_filter(request: HttpRequest) -> str:
    """`?jobs=mine|all`: whose jobs the home page lists. Mine by default, so that benchmark runs (launched by
    no one or by a bench user) and colleagues' jobs do not push a teacher's own off the list."""
    chosen = request.GET.get("jobs", "")
    return chosen if chosen in JOB_FILTERS else "mine"


def _jobs_context(request: HttpRequest) -> dict[str, Any]:
    shown = _jobs_filter(request)
    jobs = Job.objects.select_related("created_by")
    if shown == "mine":
        jobs = jobs.filter(created_by_id=request.user.pk)
    active = jobs.filter(status__in=[Job.Status.QUEUED, Job.Status.RUNNING])
    recent = jobs.filter(status__in=Job.FINISHED)[:RECENT_JOBS]
    return {
        "active_jobs": _with_setup(active.order_by("id")),
        "recent_jobs": _with_setup(recent),
        "jobs_filter": shown,
    }


@require_safe
def favicon(request: HttpRequest) -> HttpResponseBase:
    """/favicon.ico, which browsers and tools ask for whatever the page links: the app's own icon, no sign-in."""
    found = finders.find(FAVICON)
    if not isinstance(found, str):
        raise Http404("No icon.")
    response = FileResponse(open(found, "rb"), content_type="image/x-icon")  # noqa: SIM115 (closed by Django)
    response["Cache-Control"] = "public, max-age=86400"
    return response


@require_safe
@login_required
def home(request: HtmxHttpRequest) -> HttpResponse:
    if request.htmx:
        return render(request, "web/home.html#jobs", _jobs_context(request))
    return render(request, "web/home.html", {"scenarios": list(SCENARIOS.values()), **_jobs_context(request)})


def _form_sections(spec: Scenario, form: forms.Form) -> list[tuple[str, list[forms.BoundField]]]:
    """The launch form's fields, grouped as the scenario declares (the way a person thinks about a run)."""
    groups = spec.sections
    placed = {name for names in groups.values() for name in names}
    sections = [(title, [form[n] for n in names if n in form.fields]) for title, names in groups.items()]
    rest = [form[n] for n in form.fields if n not in placed]
    if rest:
        sections.append(("More", rest))
    return [(title, fields) for title, fields in sections if fields]


@require_http_methods(["GET", "HEAD", "POST"])
@login_required
def job_new(request: HtmxHttpRequest, scenario: str) -> HttpResponse:
    if scenario not in SCENARIOS:
        raise Http404("No such scenario.")
    spec = SCENARIOS[scenario]
    preset = None
    if request.method == "POST":
        try:
            job = launch(scenario, request.POST.dict(), request.user)
        except ParamsError as refused:
            # Bind the same data to the same form: its errors are the ones launch() refused with.
            form = spec.form_class(data=request.POST)
            if form.is_valid() and isinstance(refused, LaunchRefused):
                form.add_error(None, refused.message)  # valid, but no room now: said above the fields
        else:
            url = reverse("job_detail", args=[job.pk])
            return HttpResponseClientRedirect(url) if request.htmx else redirect(url)
    else:
        slug = request.GET.get("preset", "")
        preset = next((p for p in spec.presets if p.slug == slug), None)
        form = spec.form_class(initial=preset.params if preset else None)
    context = {
        "spec": spec,
        "form": form,
        "sections": _form_sections(spec, form),
        "presets": spec.presets,
        "preset": preset,
    }
    if request.htmx and not request.htmx.boosted:
        # 200 even with errors: htmx 2 does not swap 4xx responses, and the errors must show inline.
        return render(request, "web/job_new.html#launch-form", context)
    return render(request, "web/job_new.html", context, status=400 if form.is_bound else 200)


def _actor_rows(spec: Scenario | None, job: Job) -> list[tuple[int, str]]:
    """(number, name) of the job's actors: those its parameters start, and those controls added since."""
    if spec is None:
        return []
    names = spec.actor_names(job.params)
    adding = [control.action for control in spec.controls if control.adds_actor]
    if adding:
        added = JobControl.objects.filter(job=job, action__in=adding, outcome="").exclude(applied_at=None).count()
        names += [spec.actor_name(n) for n in range(len(names) + 1, len(names) + added + 1)]
    return list(enumerate(names, start=1))


def _job_context(request: HttpRequest, job: Job, control_note: str = "") -> dict[str, Any]:
    spec = _spec(job)
    return {
        "actor_rows": _actor_rows(spec, job) if spec and spec.controls and not job.is_finished else [],
        # each control with the seconds its button applies (a pause twice the lease, say)
        "offered_controls": [(c, spec.control_seconds(c.action, job.params)) for c in spec.controls] if spec else [],
        "per_actor_controls": any(c.per_actor for c in spec.controls) if spec else False,
        "control_note": control_note,
        "job": job,
        "spec": spec,
        "setup": spec.setup(job.params) if spec else "",
        "tag": _tag(job),
        "vocabulary": spec.vocabulary(job.params) if spec else None,
        "may_control": job.may_be_controlled_by(request.user),
        "params": sorted(job.params.items()),
        "summary": job.summary or {},
        "shards": shard_table(job, spec),
        **_watched_objects(job),
    }


_WATCHED_LINKS = 8


def _watched_objects(job: Job) -> dict[str, Any]:
    """The job's objects, for links to their watch pages: the first of each kind, then a few more, by kind."""
    found: list[list[tuple[str, str, str]]] = []
    for kind in object_kinds.KINDS:
        rows = kind.model._default_manager.filter(job=job).order_by("pk").values_list("namespace", "name")
        found.append([(kind.plural, namespace, name) for namespace, name in rows[: _WATCHED_LINKS + 1]])
    # The first of each kind first, so that a quota is linked however many pods its race made.
    picked = [objects[:1] for objects in found]
    room = _WATCHED_LINKS - sum(map(len, picked))
    for objects, chosen in zip(found, picked, strict=True):
        more = objects[1 : 1 + max(room, 0)]
        chosen += more
        room -= len(more)
    watched = [link for chosen in picked for link in chosen][:_WATCHED_LINKS]
    return {"watched": watched, "watched_more": sum(map(len, found)) > len(watched)}


@require_safe
@login_required
def job_detail(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(Job.objects.select_related("created_by"), pk=job_id)
    # A job whose runner died says so here, rather than "running" (or "cancelling...") forever.
    end_if_stale(job)
    context = _job_context(request, job)
    # The page's script asks for the controls again when the job ends (no more cancel button), and
    # for its objects once it has made them; the table of its shards asks every second while the job runs.
    if request.htmx and request.htmx.target in ("controls", "actor-controls", "watched-objects", "shards"):
        return render(request, f"web/job_detail.html#{request.htmx.target}", context)
    return render(request, "web/job_detail.html", {**context, "live": fragments.first_render_context(job_state(job))})


@require_POST
@login_required
def job_cancel(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(Job, pk=job_id)
    if not job.may_be_controlled_by(request.user):
        return HttpResponseForbidden("Only whoever launched this job, or staff, may cancel it.")
    if not job.is_finished:
        job.request_cancel()
    if request.htmx:
        return render(request, "web/job_detail.html#controls", _job_context(request, job))
    return redirect(_back_to_the_job(request, job))


@require_POST
@login_required
def job_control(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    """Apply a failure control to a running job (kill a leader, pause it...): 202, or why not, changing nothing."""
    job = get_object_or_404(Job, pk=job_id)
    if not job.may_be_controlled_by(request.user):
        return HttpResponseForbidden("Only whoever launched this job, or staff, may control it.")
    spec = _spec(job)
    try:
        action, actor, seconds = _control_request(request, job, spec)
        job.request_control(action, actor, seconds, request.user)
    except ValueError as refused:
        return HttpResponse(str(refused), status=400, content_type="text/plain; charset=utf-8")
    except JobNotRunning as refused:
        return HttpResponse(str(refused), status=409, content_type="text/plain; charset=utf-8")
    target = f" {spec.actor_name(actor)}" if spec and actor is not None else ""
    note = f"Sent: {action}{target}{f' for {seconds:g} s' if seconds else ''}."
    if spec and seconds is not None and (control := spec.control(action)) and control.unit == "ms":
        note = f"Sent: {action}{target} {seconds * 1000:g} ms."
    if request.htmx:
        return render(request, "web/job_detail.html#actor-controls", _job_context(request, job, note), status=202)
    return redirect(_back_to_the_job(request, job))


def _back_to_the_job(request: HttpRequest, job: Job) -> str:
    """Where a form posted without htmx returns: the job's page as it was asked for (presenter mode stays on)."""
    page = reverse("job_detail", args=[job.pk])
    came_from = urlsplit(request.headers.get("Referer", ""))
    if came_from.path == page and came_from.netloc == request.get_host() and came_from.query == "present=1":
        return f"{page}?present=1"
    return page


def _control_request(request: HttpRequest, job: Job, spec: Scenario | None) -> tuple[str, int | None, float | None]:
    """The control asked for, validated against what the job's scenario offers (ValueError says what is wrong)."""
    action = request.POST.get("action", "")
    control = spec.control(action) if spec else None
    if spec is None or control is None:
        offered = ", ".join(c.action for c in spec.controls) if spec and spec.controls else "none"
        raise ValueError(f"unknown control {action!r} for this job (it offers: {offered})")
    actor = None
    if control.per_actor:
        raw = request.POST.get("actor", "")
        known = len(_actor_rows(spec, job))
        if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= known):
            raise ValueError(f"actor={raw!r}: give the number of one of the job's {known} actors")
        actor = int(raw)
    if control.seconds is None:
        return action, actor, None
    low, high = control.seconds
    if control.unit == "ms":  # a value in ms (a latency), handed on in seconds
        raw_ms = request.POST.get("ms", "")
        ms = _seconds(raw_ms)
        if ms is None or not low * 1000 <= ms <= high * 1000:
            raise ValueError(f"ms={raw_ms!r}: give a number of milliseconds from {low * 1000:g} to {high * 1000:g}")
        return action, actor, ms / 1000.0
    raw_seconds = request.POST.get("seconds", "")
    seconds = spec.control_seconds(action, job.params) if raw_seconds == "" else _seconds(raw_seconds)
    if seconds is None or not low <= seconds <= high:
        raise ValueError(f"seconds={raw_seconds!r}: give a number of seconds from {low:g} to {high:g}")
    return action, actor, seconds


def _seconds(raw: str) -> float | None:
    """ASCII digits only: float() would also take '٣'."""
    if not raw.isascii():
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _whole_number(raw: str) -> int:
    """A whole number written in ASCII (int() would also take "٣" as 3); ValueError otherwise."""
    if not raw.isascii():
        raise ValueError(raw)
    return int(raw)


def _int_param(request: HttpRequest, name: str, default: int, low: int, high: int) -> int:
    raw = request.GET.get(name, "")
    if raw == "":
        return default
    try:
        value = _whole_number(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number in the digits 0-9, not {raw!r}.") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}.")
    return value


@require_safe
@_json_login_required
def job_events(request: HttpRequest, job_id: int) -> HttpResponse:
    """`?after=<seq>&limit=<n>`: the next page of the job's stored events, in seq order."""
    return events_response(request, get_object_or_404(Job, pk=job_id))


def events_response(request: HttpRequest, job: Job) -> HttpResponse:
    """The page of `job`'s events that `?after=<seq>&limit=<n>` asks for (the job page's, a student page's)."""
    try:
        after = _int_param(request, "after", 0, 0, 2**62)
        limit = _int_param(request, "limit", 1_000, 1, events.MAX_PAGE)
    except ValueError as error:
        return JsonResponse({"error": str(error)}, status=400)
    if job.events_pruned_at is not None:
        pruned = {"pruned_at": job.events_pruned_at.isoformat(), "last_seq": job.last_seq}
        return JsonResponse({"error": events.pruned_notice(job), **pruned}, status=410)
    return JsonResponse(events.events_page(job, after, limit))


@require_safe
@_json_login_required
def job_summary(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(Job, pk=job_id)
    return JsonResponse(
        {
            "id": job.pk,
            "scenario": job.scenario,
            "strategy": job.params.get("strategy"),
            "status": job.status,
            "params": job.params,
            "created_at": job.created_at.isoformat(),
            "started_at": job.started_at.isoformat() if job.started_at else None,
            "finished_at": job.finished_at.isoformat() if job.finished_at else None,
            "last_seq": job.last_seq,
            "invariant_ok": job.invariant_ok,
            "error": job.error or None,
            "summary": job.summary,
        },
        json_dumps_params={"indent": 2},
    )


_EXPORTS = {"jsonl": "application/jsonl; charset=utf-8", "csv": "text/csv; charset=utf-8"}


@require_safe
@login_required
def job_export(request: HttpRequest, job_id: int, fmt: str) -> HttpResponseBase:
    """All the job's events in seq order, streamed a page at a time (410 once they were pruned)."""
    job = get_object_or_404(Job, pk=job_id)
    if fmt not in _EXPORTS:
        raise Http404("No such export format.")
    if job.events_pruned_at is not None:
        return HttpResponse(events.pruned_notice(job), status=410, content_type="text/plain; charset=utf-8")
    # Under an ASGI server a sync iterator would be read whole into memory first: give it an async one.
    content = (
        events.aexport_lines(job.pk, fmt) if isinstance(request, ASGIRequest) else events.export_lines(job.pk, fmt)
    )
    response = StreamingHttpResponse(content, content_type=_EXPORTS[fmt])
    response["Content-Disposition"] = f'attachment; filename="occviz-job-{job.pk}-events.{fmt}"'
    return response


def _seq_param(request: HttpRequest, job: Job) -> int:
    """`?seq=N`: an event of the job (0: before its first); omitted, its last. ValueError says what is wrong."""
    raw = request.GET.get("seq", "")
    if raw == "":
        return job.last_seq
    if not (raw.isascii() and raw.isdigit()):
        raise ValueError(f"seq must be a whole number (0 or more) in the digits 0-9, not {raw!r}.")
    seq = int(raw)
    if seq > job.last_seq:
        raise ValueError(f"seq={seq} is beyond the job's last event ({job.last_seq}).")
    return seq


@require_safe
@_json_login_required
def job_snapshot(request: HttpRequest, job_id: int) -> HttpResponse:
    """What the job showed as of event `?seq=N` (the snapshot at or before it; N omitted: the latest)."""
    job = get_object_or_404(Job, pk=job_id)
    try:
        seq = _seq_param(request, job)
    except ValueError as error:
        return JsonResponse({"error": str(error)}, status=400)
    return JsonResponse(snapshot_or_empty(job.pk, seq))


@require_safe
@login_required
def job_fragments(request: HttpRequest, job_id: int) -> HttpResponse:
    """The job page's figures, state and log as of event `?seq=N`, for replay to swap in (the live page's own)."""
    job = get_object_or_404(Job, pk=job_id)
    try:
        seq = _seq_param(request, job)
    except ValueError as error:
        return HttpResponseBadRequest(str(error), content_type="text/plain; charset=utf-8")
    context = fragments.context_at(job_state(job), seq)
    return HttpResponse(fragments.render(context, "figures", "state", "log"))


@require_safe
@login_required
def job_replay(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(Job.objects.select_related("created_by"), pk=job_id)
    # Before the first event: what the page shows at the replay's start, until the script swaps in each moment.
    live = fragments.context_at(job_state(job), 0)
    return render(request, "web/job_replay.html", {**_job_context(request, job), "live": live})


@require_safe
@login_required
def job_compare(request: HttpRequest) -> HttpResponse:
    # ?ids=3,4 from a link, or ?id=3&id=4 from the home page's tick boxes.
    raw = ",".join([request.GET.get("ids", ""), *request.GET.getlist("id")])
    try:
        ids = list(dict.fromkeys(_whole_number(part.strip()) for part in raw.split(",") if part.strip()))
    except ValueError:
        return HttpResponseBadRequest("ids must be job numbers separated by commas, e.g. ?ids=3,4")
    if not 2 <= len(ids) <= MAX_COMPARE:
        recent = _with_setup(Job.objects.filter(status__in=Job.FINISHED)[:30])
        return render(
            request,
            "web/job_compare.html",
            {"jobs": [], "choices": recent, "ids": ids, "max_compare": MAX_COMPARE},
            status=400 if raw.strip(",") else 200,
        )
    found = Job.objects.in_bulk(ids)
    missing = [i for i in ids if i not in found]
    if missing:
        raise Http404(f"No job {', '.join(map(str, missing))}.")
    jobs = [found[i] for i in ids]
    # One bin width for every job, so the charts share their time axis as well as their scale.
    bin_ms = events.bin_for(max(events.duration_ms(job) for job in jobs))
    specs = {job.pk: _spec(job) for job in jobs}
    kinds_of = {pk: spec.rates if spec else () for pk, spec in specs.items()}
    # Each chart is drawn with its own job's vocabulary: its parameters name its actors.
    series = [
        {
            "id": job.pk,
            "label": f"#{job.pk} {_tag(job) or job.scenario}",
            "scenario": job.scenario,
            "vocabulary": spec.vocabulary(job.params) if (spec := specs[job.pk]) else None,
            "rates": rates,
        }
        for job, rates in zip(jobs, events.aligned_rate_series(jobs, bin_ms, kinds_of), strict=True)
    ]
    return render(
        request,
        "web/job_compare.html",
        {
            "jobs": _with_setup(jobs),
            "rows": _compare_rows(jobs),
            "series": {"bin_ms": bin_ms, "jobs": series},
            "ids": ids,
            "max_compare": MAX_COMPARE,
        },
    )


def _summary_value(job: Job, key: str) -> Any:
    """A summary figure by dotted key (`latency_ms.p95`), else the parameter of that name."""
    value: Any = job.summary or {}
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return job.params.get(key) if value is None else value


def _compare_rows(jobs: list[Job]) -> list[tuple[str, list[Any]]]:
    """Each job's figures as its final snapshot has them, then what else its scenario compares (its parameters,
    the summary's verdict figures), in order, once each (jobs of several scenarios: all of them).

    Two scenarios may word different figures alike ("conflicts"): those rows say whose they are.
    """
    finals = [snapshot_or_empty(job.pk, job.last_seq)["figures"] for job in jobs]
    rows: dict[str, tuple[str, str, list[Any]]] = {}
    for job in jobs:
        spec = _spec(job)
        for figure in spec.shown_figures() if spec else ():
            if spec and figure.key not in rows:
                values = [_figure_text(final.get(figure.key)) for final in finals]
                rows[figure.key] = (figure.label, spec.title.lower(), values)
    for job in jobs:
        spec = _spec(job)
        for key, label in spec.compared if spec else ():
            if spec and key not in rows:
                rows[key] = (label, spec.title.lower(), [_summary_value(other, key) for other in jobs])
    alike = collections.Counter(label for label, _, _ in rows.values())
    return [(f"{label} ({title})" if alike[label] > 1 else label, values) for label, title, values in rows.values()]


def _figure_text(value: Any) -> Any:
    """A figure as the page shows it: percentiles as p50 / p95 / p99."""
    if isinstance(value, dict):
        return " / ".join("\u2013" if value.get(p) is None else f"{value[p]:g}" for p in ("p50", "p95", "p99"))
    return value


def _watched(resource: str) -> str:
    if resource not in object_kinds.BY_PLURAL:
        raise Http404(f"No resource {resource!r}: one of {', '.join(object_kinds.BY_PLURAL)}.")
    return resource


def _seen(resource: str, namespace: str, name: str, **cursors: int) -> dict[str, Any]:
    """The object's history, its stored content also as the text the page shows (nested values as YAML)."""
    seen = watch.history(_watched(resource), namespace, name, **cursors)
    if seen["object"] is not None:
        seen["object"]["text"] = yaml_text(seen["object"]["fields"])
    return seen


@require_safe
@login_required
def watch_page(request: HttpRequest, resource: str, namespace: str, name: str) -> HttpResponse:
    """One object's history as it happens: every version, who wrote it, the conflicts (kubectl get -w)."""
    seen = _seen(resource, namespace, name)
    context = {
        "resource": resource,
        "namespace": namespace,
        "name": name,
        "api_path": object_kinds.BY_PLURAL[resource].object_path(namespace, name),
        "seen": seen,
        "newest": watch.NEWEST,
    }
    return render(request, "web/watch.html", context)


@require_safe
@_json_login_required
def watch_history(request: HttpRequest, resource: str, namespace: str, name: str) -> HttpResponse:
    """What happened to the object since the cursors `after_change` and `after_seq` (the page polls it)."""
    try:
        after_change = _int_param(request, "after_change", 0, 0, 2**62)
        after_seq = _int_param(request, "after_seq", 0, 0, 2**62)
    except ValueError as refused:
        return JsonResponse({"error": str(refused)}, status=400)
    return JsonResponse(_seen(resource, namespace, name, after_change=after_change, after_seq=after_seq))
