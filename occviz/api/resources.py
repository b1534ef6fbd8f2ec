"""The verbs on the served kinds: list, get, create, replace, merge patch, delete.

Every write goes through occviz.store.writes, as the admin's do: a body or an `If-Match`
with a resourceVersion is a checked write (a stale one is 409, or 412 for If-Match, and
is logged as a conflict), one without is an unconditional (blind) write. A merge patch
without a version is applied to the object as it is now and written checked against the
version it was applied to, again on a conflict, as the API server does.

`?dryRun=All` (or a DeleteOptions' `dryRun: ["All"]`) runs each verb whole, checks and
quota admission included, inside `writes.dry_run()`, which takes it all back: the answer is
what would have been stored, with the version the object still has (none for a create).
"""

from __future__ import annotations

import itertools
import json
import re
import secrets
import string
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime
from typing import Any

import pydantic
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse

from occviz.api import schemas
from occviz.api.auth import Caller
from occviz.api.kinds import FieldInvalid, Kind, label_error, subdomain_error
from occviz.api.status import ApiError, json_response, resource_details
from occviz.store import writes
from occviz.store.cas import ANY
from occviz.store.models import VersionConflict, VersionedObject

JSON = "application/json"
MERGE_PATCHES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
PATCH_RETRIES = 5
MAX_DEPTH = 100
"""How deep a body may nest objects and arrays: far beyond any object's, well within what pydantic parses (200)."""
UINT64_MAX = 2**64 - 1
"""The API server reads a resourceVersion as an unsigned 64-bit number."""
DRY_RUN_ALL = "All"
# A JSON string (its escapes included), and what is left of a body once they are gone that is not a bracket.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# pydantic error types that say a value has the wrong type, not a value out of range: 400, not 422.
_UNION_BRANCHES = {"constrained-int", "constrained-str", "int", "str"}


# -- reading the request ---------------------------------------------------------------


def _body_bytes(request: HttpRequest) -> bytes:
    try:
        return request.body
    except RequestDataTooBig:
        raise ApiError(413, "the request body is too large") from None


def json_body(request: HttpRequest, kind_name: str, accepted: tuple[str, ...] = (JSON,)) -> Any:
    """The request's body as JSON; 415 for a media type not in `accepted`, 400 for malformed JSON.

    No Content-Type at all is taken as JSON where JSON is accepted: the official Python client
    sends none with a create or a replace.
    """
    media_type = request.content_type or (JSON if JSON in accepted else "")
    if media_type not in accepted:
        raise ApiError(
            415,
            f"the body of the request was in an unknown format ({request.content_type or 'no Content-Type'}) - "
            f"accepted media types include: {', '.join(accepted)}",
        )
    raw = _body_bytes(request)
    if _nesting(raw) > MAX_DEPTH:
        raise ApiError(
            400,
            f'{kind_name} in version "v1" cannot be handled as a {kind_name}: invalid JSON: exceeded max depth '
            f"(objects and arrays nested more than {MAX_DEPTH} deep)",
        )
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise ApiError(
            400, f'{kind_name} in version "v1" cannot be handled as a {kind_name}: invalid JSON: {error}'
        ) from None


def _nesting(raw: bytes) -> int:
    """How deep `raw` nests objects and arrays, counted in one pass over its brackets outside strings.

    Without recursion, before anything that recurses (json.loads, the merge, pydantic) sees the body.
    """
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(1 if byte in b"[{" else -1 for byte in brackets), default=0)


def asks_dry_run(request: HttpRequest, options_kind: str, in_body: list[str] | None = None) -> bool:
    """Whether the request asks for a dry run: `?dryRun=All` (or `in_body`, a DeleteOptions' dryRun).

    Any other value is refused as the API server refuses it: 422, the options (`options_kind`) invalid.
    """
    values = request.GET.getlist("dryRun") + list(in_body or [])
    unsupported = [value for value in values if value != DRY_RUN_ALL]
    if unsupported:
        listed = ", ".join(json.dumps(value) for value in values)
        message = f'Unsupported value: []string{{{listed}}}: supported values: "{DRY_RUN_ALL}"'
        raise ApiError(
            422,
            f'{options_kind}.meta.k8s.io "" is invalid: dryRun: {message}',
            details={
                "group": "meta.k8s.io",
                "kind": options_kind,
                "causes": [{"reason": "FieldValueNotSupported", "message": message, "field": "dryRun"}],
            },
        )
    return bool(values)


def writing(dry: bool) -> AbstractContextManager[None]:
    """Where a verb writes: in `writes.dry_run()` for a dry run, which takes every write back."""
    return writes.dry_run() if dry else nullcontext()


def _path(loc: tuple[int | str, ...]) -> str:
    parts = list(loc)
    while parts and parts[-1] in _UNION_BRANCHES:
        parts.pop()
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _is_type_error(kind: str) -> bool:
    return kind.endswith(("_type", "_parsing")) or kind in ("json_invalid", "missing")


def validated[M: pydantic.BaseModel](schema: type[M], data: Any, kind: Kind | None, name: str) -> M:
    """`data` parsed by `schema`: 400 for a wrong type, 422 Invalid for a value out of range (saying which field)."""
    kind_name = kind.kind if kind else schema.__name__
    try:
        return schema.model_validate_json(json.dumps(data))
    except pydantic.ValidationError as error:
        problems = error.errors()
    range_errors = [p for p in problems if not _is_type_error(p["type"])]
    if not range_errors:
        first = problems[0]
        got = json.dumps(first.get("input"))[:80]
        raise ApiError(
            400,
            f'{kind_name} in version "v1" cannot be handled as a {kind_name}: '
            f"{_path(first['loc'])}: {first['msg']} (got {got})",
        ) from None
    invalid = [FieldInvalid(_path(p["loc"]), p.get("input"), p["msg"].lower()) for p in range_errors]
    raise invalid_error(kind, schema.__name__, name, invalid)


def invalid_error(kind: Kind | None, kind_name: str, name: str, problems: list[FieldInvalid]) -> ApiError:
    """422 Invalid as the API server words it: `Lease.coordination.k8s.io "x" is invalid: <field>: ...`."""
    seen: dict[str, FieldInvalid] = {}
    for problem in problems:
        seen.setdefault(problem.field, problem)
    causes = [
        {"reason": "FieldValueInvalid", "message": f"Invalid value: {json.dumps(p.value)}: {p.why}", "field": p.field}
        for p in seen.values()
    ]
    qualified = f"{kind.kind}.{kind.group}" if kind and kind.group else (kind.kind if kind else kind_name)
    listed = ", ".join(f"{c['field']}: {c['message']}" for c in causes)
    details: dict[str, Any] = {"name": name}
    if kind and kind.group:
        details["group"] = kind.group
    details |= {"kind": kind.kind if kind else kind_name, "causes": causes}
    return ApiError(422, f'{qualified} "{name}" is invalid: {listed}', details=details)


def _version(text: str, source: str) -> int:
    """A resourceVersion as the API server reads one, an unsigned 64-bit number (past the store's range is stale)."""
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(UINT64_MAX)) or int(text) > UINT64_MAX:
        raise ApiError(
            400,
            f'{source}: Invalid value: "{text[:40]}": '
            f"must be a resourceVersion (a decimal number from 0 to {UINT64_MAX})",
        )
    return int(text)


def if_match(request: HttpRequest) -> int | None:
    """The version an `If-Match: "<resourceVersion>"` header asks for (None without one, or `*`)."""
    header = request.headers.get("If-Match", "").strip()
    if not header or header == "*":
        return None
    tag = header.removeprefix("W/").strip('"')
    return _version(tag, "If-Match")


def check_url_part(value: str, what: str) -> None:
    """A namespace or name from the URL that the database could not even compare (NUL, too long): 400."""
    if "\x00" in value or len(value) > 253:
        raise ApiError(400, f"the {what} in the URL is not a valid name: {json.dumps(value[:80])}")


def no_nul(value: Any, field: str = "") -> None:
    """PostgreSQL text cannot hold NUL: refuse it in any string of the body (422), rather than fail to store it."""
    if isinstance(value, str):
        if "\x00" in value:
            raise FieldInvalid(field or "body", value, "must not contain the NUL character")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            no_nul(key, field)
            no_nul(item, f"{field}.{key}" if field else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            no_nul(item, f"{field}[{index}]")


def _times_in_range(fields: dict[str, Any]) -> None:
    for key, value in list(fields.items()):
        if isinstance(value, datetime):
            try:
                fields[key] = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
            except OverflowError:
                raise FieldInvalid(key, value.isoformat(), "out of range once in UTC") from None


# -- the objects ------------------------------------------------------------------------


def load(kind: Kind, namespace: str, name: str) -> VersionedObject:
    check_url_part(namespace, "namespace")
    check_url_part(name, "name")
    obj = kind.model._default_manager.filter(namespace=namespace, name=name).first()
    if obj is None:
        raise not_found(kind, name)
    return obj


def not_found(kind: Kind, name: str) -> ApiError:
    return ApiError(
        404,
        f'{kind.model.qualified_resource()} "{name}" not found',
        details=resource_details(name, kind.group, kind.plural),
    )


def conflict(kind: Kind, error: VersionConflict, name: str) -> ApiError:
    return ApiError(409, str(error), details=resource_details(name, kind.group, kind.plural))


def object_response(kind: Kind, obj: VersionedObject, status: int = 200) -> HttpResponse:
    return json_response(kind.to_json(obj), status=status, etag=str(obj.resource_version))


def list_json(kind: Kind, objects: list[VersionedObject]) -> dict[str, Any]:
    """A <Kind>List. Its resourceVersion is the newest of its items' (versions here are per object)."""
    newest = max((obj.resource_version for obj in objects), default=1)
    return {
        "apiVersion": kind.api_version,
        "kind": f"{kind.kind}List",
        "metadata": {"resourceVersion": str(newest)},
        "items": [kind.to_json(obj) for obj in objects],
    }


def field_selector(request: HttpRequest) -> dict[str, str]:
    """`fieldSelector=metadata.name=demo,metadata.namespace=x` (what kubectl sends for `get <name> -w`)."""
    selected: dict[str, str] = {}
    raw = request.GET.get("fieldSelector", "")
    for term in filter(None, raw.split(",")):
        key, sep, value = term.partition("=")
        value = value.removeprefix("=")  # `==` is allowed too
        if not sep or key not in ("metadata.name", "metadata.namespace"):
            raise ApiError(
                400, f'"{term}" is not a known field selector: only "metadata.name" and "metadata.namespace"'
            )
        check_url_part(value, key)
        selected[key] = value
    return selected


def query(kind: Kind, namespace: str | None, request: HttpRequest) -> Any:
    """The kind's objects in `namespace` (None: every namespace) that the request's field selector picks."""
    objects = kind.model._default_manager.all()
    if namespace is not None:
        check_url_part(namespace, "namespace")
        objects = objects.filter(namespace=namespace)
    selected = field_selector(request)
    if "metadata.name" in selected:
        objects = objects.filter(name=selected["metadata.name"])
    if "metadata.namespace" in selected:
        objects = objects.filter(namespace=selected["metadata.namespace"])
    return objects.order_by("namespace", "name")


def _parse_object(kind: Kind, data: Any, url_namespace: str, url_name: str | None) -> tuple[Any, str]:
    """The body validated as the kind, with its name (from the URL on PUT): the checks the API server makes first."""
    if not isinstance(data, dict):
        raise ApiError(
            400, f'{kind.kind} in version "v1" cannot be handled as a {kind.kind}: the body must be a JSON object'
        )
    api_version, kind_name = data.get("apiVersion"), data.get("kind")
    if api_version is not None and api_version != kind.api_version:
        raise ApiError(
            400,
            f"the API version in the data ({api_version}) does not match the expected API version ({kind.api_version})",
        )
    if kind_name is not None and kind_name != kind.kind:
        raise ApiError(400, f"the kind in the data ({kind_name}) does not match the expected kind ({kind.kind})")
    body = validated(kind.schema, data, kind, url_name or _name_in(data))
    try:
        no_nul(data)
    except FieldInvalid as problem:
        raise invalid_error(kind, kind.kind, url_name or _name_in(data), [problem]) from None
    meta = body.metadata
    if meta.namespace is not None and meta.namespace != url_namespace:
        raise ApiError(
            400,
            f"the namespace of the provided object ({meta.namespace}) does not match the namespace sent on the request "
            f"({url_namespace})",
        )
    if url_name is not None and meta.name is not None and meta.name != url_name:
        raise ApiError(400, f"the name of the object ({meta.name}) does not match the name on the URL ({url_name})")
    name = url_name or meta.name
    if not name and meta.generateName:
        name = meta.generateName + "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))
    if not name:
        raise invalid_error(
            kind, kind.kind, "", [FieldInvalid("metadata.name", "", "name or generateName is required")]
        )
    return body, name


def _name_in(data: dict[str, Any]) -> str:
    meta = data.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def _store_fields(kind: Kind, body: Any, current: VersionedObject | None, name: str) -> dict[str, Any]:
    try:
        fields = kind.fields(body, current)
        _times_in_range(fields)
    except FieldInvalid as problem:
        raise invalid_error(kind, kind.kind, name, [problem]) from None
    return fields


def _expected(request: HttpRequest, body_version: str | None) -> tuple[int | object, bool]:
    """The version a write is checked against (ANY: blind), and whether If-Match asked for it (412 then)."""
    match = if_match(request)
    version = _version(body_version, "metadata.resourceVersion") if body_version else None
    if match is not None and version is not None and match != version:
        raise ApiError(
            412, f'If-Match "{match}" and metadata.resourceVersion "{version}" ask for different versions of the object'
        )
    if match is not None:
        return match, True
    return (version if version is not None else ANY), False


def _refused(kind: Kind, error: VersionConflict, name: str, by_if_match: bool) -> ApiError:
    if by_if_match:
        stored = error.stored.resource_version if error.stored else "?"
        return ApiError(
            412,
            f'precondition failed: If-Match asked for version "{error.expected_version}" of '
            f'{kind.model.qualified_resource()} "{name}", which is at "{stored}" now',
            details=resource_details(name, kind.group, kind.plural),
        )
    return conflict(kind, error, name)


def _answer(kind: Kind, obj: VersionedObject, dry: bool, version_now: int | None, status: int = 200) -> HttpResponse:
    """The object as written. A dry run's, as the API server answers one: with the version the object
    still has (`version_now`), none for an object it did not create."""
    if not dry:
        return object_response(kind, obj, status)
    body = kind.to_json(obj)
    if version_now is None:
        del body["metadata"]["resourceVersion"]
        return json_response(body, status=status)
    body["metadata"]["resourceVersion"] = str(version_now)
    return json_response(body, status=status, etag=str(version_now))


def create(request: HttpRequest, caller: Caller, kind: Kind, namespace: str) -> HttpResponse:
    dry = asks_dry_run(request, "CreateOptions")
    data = json_body(request, kind.kind)
    body, name = _parse_object(kind, data, namespace, None)
    problems = []
    if why := subdomain_error(name):
        problems.append(FieldInvalid("metadata.name", name, why))
    if why := label_error(namespace):
        problems.append(FieldInvalid("metadata.namespace", namespace, why))
    if problems:
        raise invalid_error(kind, kind.kind, name, problems)
    fields = _store_fields(kind, body, None, name)
    if kind.model._default_manager.filter(namespace=namespace, name=name).exists():
        raise _already_exists(kind, writes.AlreadyExists(kind.model, name))  # before admission charges anything
    try:
        with writing(dry), kind.admitted(namespace, name, fields, caller.writer):
            obj = writes.create(kind.model, {"namespace": namespace, "name": name, **fields}, caller.writer)
    except writes.AlreadyExists as error:
        raise _already_exists(kind, error) from None
    return _answer(kind, obj, dry, None, status=201)


def _already_exists(kind: Kind, error: writes.AlreadyExists) -> ApiError:
    return ApiError(
        409, str(error), reason="AlreadyExists", details=resource_details(error.name, kind.group, kind.plural)
    )


def replace(request: HttpRequest, caller: Caller, kind: Kind, namespace: str, name: str) -> HttpResponse:
    dry = asks_dry_run(request, "UpdateOptions")
    data = json_body(request, kind.kind)
    body, _ = _parse_object(kind, data, namespace, name)
    current = load(kind, namespace, name)
    fields = _store_fields(kind, body, current, name)
    expected, by_if_match = _expected(request, body.metadata.resourceVersion)
    try:
        with writing(dry):
            written = writes.update(current, fields, caller.writer, expected_version=expected)
    except VersionConflict as error:
        raise _refused(kind, error, current.name, by_if_match) from None
    except kind.model.DoesNotExist:
        raise not_found(kind, current.name) from None
    return _answer(kind, written, dry, current.resource_version)


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


def patch(request: HttpRequest, caller: Caller, kind: Kind, namespace: str, name: str) -> HttpResponse:
    dry = asks_dry_run(request, "PatchOptions")
    data = json_body(request, kind.kind, MERGE_PATCHES)
    if not isinstance(data, dict):
        raise ApiError(400, f"a merge patch of {kind.kind} must be a JSON object, not {type(data).__name__}")
    meta = data.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    if version is not None and not isinstance(version, str):
        raise ApiError(
            400,
            f'{kind.kind} in version "v1" cannot be handled as a {kind.kind}: '
            "metadata.resourceVersion must be a string",
        )
    expected, by_if_match = _expected(request, version)
    for _ in range(PATCH_RETRIES):
        current = load(kind, namespace, name)
        patched = merge(kind.to_json(current), data)
        body, _ = _parse_object(kind, patched, namespace, name)
        fields = _store_fields(kind, body, current, name)
        checked_against = current.resource_version if expected is ANY else expected
        try:
            with writing(dry):
                written = writes.update(current, fields, caller.writer, expected_version=checked_against)
        except VersionConflict as error:
            if expected is not ANY:
                raise _refused(kind, error, name, by_if_match) from None
            continue  # applied to a version that moved on: apply it again to the new one
        except kind.model.DoesNotExist:
            raise not_found(kind, name) from None
        return _answer(kind, written, dry, current.resource_version)
    raise ApiError(
        409,
        f'{kind.model.qualified_resource()} "{name}" changed under each of {PATCH_RETRIES} attempts '
        "to apply the patch; try again",
        details=resource_details(name, kind.group, kind.plural),
    )


def delete(request: HttpRequest, caller: Caller, kind: Kind, namespace: str, name: str) -> HttpResponse:
    options = schemas.DeleteOptions()
    if _body_bytes(request).strip():
        options = validated(schemas.DeleteOptions, json_body(request, "DeleteOptions"), None, name)
    dry = asks_dry_run(request, "DeleteOptions", options.dryRun)
    current = load(kind, namespace, name)
    preconditions = options.preconditions or schemas.Preconditions()
    if preconditions.uid is not None and preconditions.uid != current.uid:
        raise ApiError(
            409,
            f"Precondition failed: UID in precondition: {preconditions.uid}, UID in object meta: {current.uid}",
            details=resource_details(name, kind.group, kind.plural),
        )
    expected, by_if_match = _expected(request, preconditions.resourceVersion)
    try:
        with writing(dry), kind.released(current, caller.writer):
            deleted = writes.delete(current, caller.writer, expected_version=expected)
    except VersionConflict as error:
        raise _refused(kind, error, name, by_if_match) from None
    except kind.model.DoesNotExist:
        raise not_found(kind, name) from None
    return object_response(kind, deleted)
