"""The API's routes, on django-ninja: the served kinds, discovery, jobs, and the OpenAPI document.

Each route authenticates (occviz.api.auth) and answers in Kubernetes JSON; every error,
ninja's own included, is a Status body. Request bodies are read by occviz.api.resources
(the media types and the 400/422 split the API server makes); the OpenAPI document
declares them from the same pydantic models.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import HttpError, ValidationError

from occviz.api import discovery, jobs, resources, schemas, tables, watch
from occviz.api.auth import caller
from occviz.api.kinds import KINDS, Kind
from occviz.api.status import REASONS, ApiError, json_response

api = NinjaAPI(
    title="occviz",
    version="v1",
    description="The versioned objects and the jobs of occviz, served as the Kubernetes API serves them.",
    urls_namespace="k8s",
    docs_url=None,
    openapi_url="/openapi.json",
)
ERRORS = frozenset({400, 401, 403, 404, 405, 409, 412, 415, 422})
View = Callable[..., HttpResponse]
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _optional(name: str, where: str, description: str) -> dict[str, Any]:
    """An optional string parameter of an operation, as OpenAPI declares it."""
    return {"name": name, "in": where, "required": False, "description": description, "schema": {"type": "string"}}


DRY_RUN = _optional(
    "dryRun", "query", "All: make every check and answer what would be stored, storing nothing; no other value."
)
IF_MATCH = _optional(
    "If-Match", "header", 'The object\'s resourceVersion, quoted as its ETag ("12"): 412 if the object is at another.'
)


@api.exception_handler(ApiError)
def _api_error(request: HttpRequest, error: ApiError) -> HttpResponse:
    return error.response()


@api.exception_handler(ValidationError)
def _ninja_validation(request: HttpRequest, error: ValidationError) -> HttpResponse:
    problems = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg', '')}" for e in error.errors)
    return ApiError(400, f"the request is not valid: {problems}").response()


@api.exception_handler(HttpError)
def _ninja_http_error(request: HttpRequest, error: HttpError) -> HttpResponse:
    return ApiError(error.status_code, str(error), reason=REASONS.get(error.status_code)).response()


def _body(schema: str, media_types: tuple[str, ...] = (resources.JSON,)) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{schema}"} if schema else {"type": "object"}
    return {"requestBody": {"required": True, "content": {media: {"schema": ref} for media in media_types}}}


def _not_allowed(path: str, allowed: list[str]) -> View:
    """A view answering 405 on `path`, taking exactly its path parameters (ninja insists)."""
    message = f"the server does not allow this method on the requested resource (allowed: {', '.join(allowed)})"

    def refuse(request: HttpRequest, **_: str) -> HttpResponse:
        raise ApiError(405, message)

    def none(request: HttpRequest) -> HttpResponse:
        return refuse(request)

    def in_namespace(request: HttpRequest, namespace: str) -> HttpResponse:
        return refuse(request)

    def named(request: HttpRequest, name: str) -> HttpResponse:
        return refuse(request)

    def item(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
        return refuse(request)

    def of_group(request: HttpRequest, group: str) -> HttpResponse:
        return refuse(request)

    views: dict[tuple[str, ...], View] = {
        (): none,
        ("namespace",): in_namespace,
        ("name",): named,
        ("name", "namespace"): item,
        ("group",): of_group,
    }
    return views[tuple(sorted(re.findall(r"{(\w+)}", path)))]


def _with_dry_run(method: str, extra: dict[str, Any] | None) -> dict[str, Any] | None:
    """A write's OpenAPI extras with the dryRun parameter every write takes."""
    if method not in WRITES:
        return extra
    extra = dict(extra or {})
    extra["parameters"] = [dict(DRY_RUN), *extra.get("parameters", [])]
    return extra


def _route(
    path: str, views: dict[str, View], names: str, response: Any = None, extra: dict[str, dict[str, Any]] | None = None
) -> None:
    """Register `views` by method on `path`, and a 405 Status for every other method (HEAD and OPTIONS too)."""
    for method, view in views.items():
        api.default_router.add_api_operation(
            path,
            [method],
            view,
            response={200: response, 201: response, ERRORS: schemas.Status} if response else {ERRORS: schemas.Status},
            operation_id=f"{method.lower()}_{names}",
            openapi_extra=_with_dry_run(method, (extra or {}).get(method)),
        )
    others = [m for m in ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS") if m not in views]
    if others:
        api.default_router.add_api_operation(path, others, _not_allowed(path, list(views)), include_in_schema=False)


def _kind_routes(kind: Kind) -> None:
    collection = f"{kind.path}/namespaces/{{namespace}}/{kind.plural}"
    schema = kind.schema.__name__
    names = f"{kind.group.replace('.', '_') or 'core'}_{kind.plural}"

    def list_all(request: HttpRequest) -> HttpResponse:
        caller(request)
        return _list(request, kind, None)

    def list_namespaced(request: HttpRequest, namespace: str) -> HttpResponse:
        caller(request)
        return _list(request, kind, namespace)

    def create(request: HttpRequest, namespace: str) -> HttpResponse:
        return resources.create(request, caller(request), kind, namespace)

    def get(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
        caller(request)
        obj = resources.load(kind, namespace, name)
        if tables.wants_table(request):
            return json_response(tables.table(kind, [kind.to_json(obj)], str(obj.resource_version)))
        return resources.object_response(kind, obj)

    def replace(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
        return resources.replace(request, caller(request), kind, namespace, name)

    def patch(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
        return resources.patch(request, caller(request), kind, namespace, name)

    def delete(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
        return resources.delete(request, caller(request), kind, namespace, name)

    _route(f"{kind.path}/{kind.plural}", {"GET": list_all}, f"{names}_all")
    _route(collection, {"GET": list_namespaced, "POST": create}, names, kind.schema, {"POST": _body(schema)})
    _route(
        collection + "/{name}",
        {"GET": get, "PUT": replace, "PATCH": patch, "DELETE": delete},
        f"{names}_one",
        kind.schema,
        {
            "PUT": {**_body(schema), "parameters": [dict(IF_MATCH)]},
            "PATCH": {**_body("", resources.MERGE_PATCHES), "parameters": [dict(IF_MATCH)]},
            "DELETE": {
                "requestBody": {
                    "required": False,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DeleteOptions"}}},
                },
                "parameters": [dict(IF_MATCH)],
            },
        },
    )


def _list(request: HttpRequest, kind: Kind, namespace: str | None) -> HttpResponse:
    if watch.wants_watch(request):
        return watch.watch_response(request, kind, namespace)  # type: ignore[return-value]
    listed = resources.list_json(kind, list(resources.query(kind, namespace, request)))
    if tables.wants_table(request):
        return json_response(tables.table(kind, listed["items"], listed["metadata"]["resourceVersion"]))
    return json_response(listed)


for _kind in KINDS:
    _kind_routes(_kind)


# -- discovery: open to everyone, as /version and discovery are to any authenticated client --


def _get_version(request: HttpRequest) -> HttpResponse:
    return json_response(discovery.version())


def _get_api(request: HttpRequest) -> HttpResponse:
    return json_response(discovery.api_versions(request))


def _get_core(request: HttpRequest) -> HttpResponse:
    return json_response(discovery.resource_list(""))


def _get_groups(request: HttpRequest) -> HttpResponse:
    return json_response(discovery.group_list())


def _get_group(request: HttpRequest, group: str) -> HttpResponse:
    return json_response(discovery.group(group))


def _get_group_version(request: HttpRequest, group: str) -> HttpResponse:
    return json_response(discovery.resource_list(group))


def _list_namespaces(request: HttpRequest) -> HttpResponse:
    caller(request)
    return json_response(discovery.namespace_list())


def _get_namespace(request: HttpRequest, name: str) -> HttpResponse:
    caller(request)
    return json_response(discovery.namespace(name))


_route("/version", {"GET": _get_version}, "version")
_route("/api", {"GET": _get_api}, "api_versions")
_route("/api/v1", {"GET": _get_core}, "core_v1_resources")
_route("/apis", {"GET": _get_groups}, "api_groups")
_route("/apis/{group}", {"GET": _get_group}, "api_group")
_route("/apis/{group}/v1", {"GET": _get_group_version}, "api_group_v1_resources")
_route("/api/v1/namespaces", {"GET": _list_namespaces}, "namespaces")
_route("/api/v1/namespaces/{name}", {"GET": _get_namespace}, "namespace")


# -- jobs ---------------------------------------------------------------------------------

_JOBS = f"/apis/{jobs.GROUP}/v1/namespaces/{{namespace}}/jobs"


def _list_jobs_all(request: HttpRequest) -> HttpResponse:
    caller(request)
    return json_response(jobs.list_jobs(None))


def _list_jobs(request: HttpRequest, namespace: str) -> HttpResponse:
    caller(request)
    return json_response(jobs.list_jobs(namespace))


def _launch_job(request: HttpRequest, namespace: str) -> HttpResponse:
    return jobs.create(request, caller(request), namespace)


def _get_job(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
    caller(request)
    return json_response(jobs.job_json(jobs.load(namespace, name)))


def _cancel_job(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
    return jobs.cancel(request, caller(request), namespace, name)


def _job_events(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
    caller(request)
    return jobs.job_events(request, namespace, name)


_route(f"/apis/{jobs.GROUP}/v1/jobs", {"GET": _list_jobs_all}, "jobs_all")
_route(_JOBS, {"GET": _list_jobs, "POST": _launch_job}, "jobs", schemas.Job, {"POST": _body("Job")})
_route(_JOBS + "/{name}", {"GET": _get_job, "DELETE": _cancel_job}, "job", schemas.Job)
_route(_JOBS + "/{name}/cancel", {"POST": _cancel_job}, "job_cancel", schemas.Job)
_route(_JOBS + "/{name}/events", {"GET": _job_events}, "job_events")
