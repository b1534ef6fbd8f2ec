"""Jobs under the project's own group: /apis/occviz.dev/v1/namespaces/default/jobs.

A create launches the job exactly as the dashboard's form does (`occviz.jobs.tasks.launch`:
the scenario's validation, the connection budget, the per-person limit), a delete cancels
it, and `.../jobs/<id>/events?after=<seq>` pages its stored events as JSON lines, read as
the dashboard's events.json reads them (occviz.jobs.events). Jobs live in "default".
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.http import HttpRequest, HttpResponse

from occviz.api import schemas
from occviz.api.auth import Caller
from occviz.api.kinds import FieldInvalid, rfc3339
from occviz.api.resources import asks_dry_run, invalid_error, json_body, no_nul, validated, writing
from occviz.api.status import ApiError, json_response, resource_details
from occviz.jobs import events
from occviz.jobs.models import Job
from occviz.jobs.registry import ParamsError
from occviz.jobs.tasks import LaunchRefused, launch

GROUP = "occviz.dev"
NAMESPACE = "default"
_UID_NAMESPACE = uuid.UUID("0b3f9d52-6a1e-4c55-8f07-3d2b9c1e7a40")


def job_json(job: Job) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": job.status,
        "cancelRequested": job.cancel_requested,
        "lastSeq": job.last_seq,
        "invariantOk": job.invariant_ok,
    }
    if job.started_at:
        status["startTime"] = rfc3339(job.started_at)
    if job.finished_at:
        status["completionTime"] = rfc3339(job.finished_at)
    if job.error:
        status["error"] = job.error
    if job.summary is not None:
        status["summary"] = job.summary
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Job",
        "metadata": {
            "name": str(job.pk),
            "namespace": NAMESPACE,
            "uid": str(uuid.uuid5(_UID_NAMESPACE, str(job.pk))),
            # A job's state moves with its events: the last stored one numbers it.
            "resourceVersion": str(job.last_seq + 1),
            "creationTimestamp": rfc3339(job.created_at),
            **({"annotations": {"occviz.dev/created-by": job.created_by.get_username()}} if job.created_by else {}),
        },
        "spec": {"scenario": job.scenario, "params": job.params},
        "status": status,
    }


def _not_found(name: str) -> ApiError:
    return ApiError(404, f'jobs.{GROUP} "{name}" not found', details=resource_details(name, GROUP, "jobs"))


def load(namespace: str, name: str) -> Job:
    if namespace != NAMESPACE or not (name.isascii() and name.isdigit()) or len(name) > 18:
        raise _not_found(name)
    job = Job.objects.select_related("created_by").filter(pk=int(name)).first()
    if job is None:
        raise _not_found(name)
    return job


def list_jobs(namespace: str | None) -> dict[str, Any]:
    jobs = list(Job.objects.select_related("created_by").order_by("id")) if namespace in (None, NAMESPACE) else []
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "JobList",
        "metadata": {"resourceVersion": "1"},
        "items": [job_json(job) for job in jobs],
    }


def _form_value(value: Any) -> Any:
    """A JSON parameter as the launch form would have received it: text (lists as lists of text)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return [_form_value(item) for item in value]
    if value is None:
        return ""
    if isinstance(value, int | float | str):
        return str(value)
    raise ValueError(value)


def create(request: HttpRequest, caller: Caller, namespace: str) -> HttpResponse:
    dry = asks_dry_run(request, "CreateOptions")
    data = json_body(request, "Job")
    body = validated(schemas.Job, data, None, "")
    try:
        no_nul(data)
    except FieldInvalid as problem:
        raise invalid_error(None, "Job", "", [problem]) from None
    if namespace != NAMESPACE:
        raise ApiError(403, f'jobs run in the namespace "{NAMESPACE}", not "{namespace}"')
    problems = []
    form: dict[str, Any] = {}
    for key, value in body.spec.params.items():
        try:
            form[key] = _form_value(value)
        except ValueError:
            problems.append(
                FieldInvalid(f"spec.params.{key}", value, "must be a number, a string, a boolean or a list")
            )
    if problems:
        raise invalid_error(None, "Job", "", problems)
    try:
        with writing(dry):  # a dry run is launched, admitted and then taken back: no job, no task
            job = launch(body.spec.scenario, form, caller.user)
            job.refresh_from_db()
            launched = job_json(job)
    except LookupError as error:
        raise invalid_error(None, "Job", "", [FieldInvalid("spec.scenario", body.spec.scenario, str(error))]) from None
    except LaunchRefused as refused:
        raise ApiError(403, f"the job was not launched: {refused.message}") from None
    except ParamsError as error:
        fields = [
            FieldInvalid(
                "spec.params" if field == "__all__" else f"spec.params.{field}",
                body.spec.params.get(field),
                " ".join(messages),
            )
            for field, messages in error.errors.items()
        ]
        raise invalid_error(None, "Job", "", fields) from None
    return json_response(launched, status=201)


def cancel(request: HttpRequest, caller: Caller, namespace: str, name: str) -> HttpResponse:
    dry = asks_dry_run(request, "DeleteOptions")
    job = load(namespace, name)
    if not job.may_be_controlled_by(caller.user):
        raise ApiError(403, f'jobs.{GROUP} "{name}" is forbidden: only whoever launched it, or staff, may cancel it')
    with writing(dry):
        if not job.is_finished:
            job.request_cancel()
        job.refresh_from_db()
        cancelled = job_json(job)
    return json_response(cancelled)


def _whole(request: HttpRequest, name: str, default: int, high: int) -> int:
    raw = request.GET.get(name, "")
    if raw == "":
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18 or int(raw) > high:
        raise ApiError(400, f'{name}: Invalid value: "{raw[:40]}": must be a whole number from 0 to {high}')
    return int(raw)


def job_events(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
    """The job's events after `?after=<seq>` (at most `?limit=`), one JSON object a line."""
    job = load(namespace, name)
    after = _whole(request, "after", 0, 2**62)
    limit = max(1, _whole(request, "limit", 1_000, events.MAX_PAGE))
    if job.events_pruned_at is not None:
        raise ApiError(410, events.pruned_notice(job))
    page = events.events_page(job, after, limit)
    content = "".join(json.dumps(event) + "\n" for event in page["events"])
    response = HttpResponse(content, content_type="application/jsonl")
    response["X-Occviz-Last-Seq"] = str(page["last_seq"])
    response["X-Occviz-Next-After"] = str(page["next_after"])
    response["X-Occviz-More"] = "true" if page["more"] else "false"
    return response
