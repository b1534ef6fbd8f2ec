"""/openapi/v3, as kubectl reads it: an index of group versions, and each one's part of the document.

kubectl (`create`/`replace` with validation on) looks in the group version's document for
the PATCH operation of the object's kind (marked `x-kubernetes-group-version-kind`) and,
finding a `fieldValidation` query parameter there, leaves validation to the server. The
parts are cut from the one document django-ninja builds from the pydantic models (/openapi.json),
with its bounds in the older JSON Schema form kube-openapi reads (see `_draft4_bounds`).
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from django.http import HttpRequest, HttpResponse

from occviz.api.api import api
from occviz.api.kinds import KINDS
from occviz.api.status import ApiError, json_response

FIELD_VALIDATION = {
    "name": "fieldValidation",
    "in": "query",
    "description": "Ignore, Warn or Strict: how unknown fields are treated (this server ignores them).",
    "schema": {"type": "string"},
}


def _group_versions() -> dict[str, str]:
    """Each group version's key in the index ("api/v1", "apis/<group>/v1") -> its API group ("" for core)."""
    return {kind.path.lstrip("/"): kind.group for kind in KINDS}


@functools.cache
def _document() -> dict[str, Any]:
    return dict(api.get_openapi_schema(path_prefix=""))


def _kind_of(path: str, group: str) -> dict[str, str] | None:
    for kind in KINDS:
        if kind.group == group and f"/{kind.plural}" in path:
            return {"group": kind.group, "version": "v1", "kind": kind.kind}
    return None


def _draft4_bounds(node: Any) -> Any:
    """Numeric `exclusiveMinimum: 0` (JSON Schema 2020-12, as pydantic writes `gt=0`) as draft 4's
    `minimum: 0, exclusiveMinimum: true`: kube-openapi takes exclusiveMinimum for a boolean, fails to
    read the whole document otherwise, and kubectl then refuses to create anything with validation on."""
    if isinstance(node, list):
        return [_draft4_bounds(item) for item in node]
    if not isinstance(node, dict):
        return node
    bounded = {key: _draft4_bounds(value) for key, value in node.items()}
    for exclusive, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        bound = bounded.get(exclusive)
        if isinstance(bound, int | float) and not isinstance(bound, bool):
            bounded[inclusive] = bound
            bounded[exclusive] = True
    return bounded


def group_version_document(key: str) -> dict[str, Any]:
    """The part of the document under `/<key>/`, each operation marked with its kind and fieldValidation."""
    versions = _group_versions()
    if key not in versions:
        raise ApiError(404, "the server could not find the requested resource")
    document = copy.deepcopy(_document())
    paths: dict[str, Any] = {}
    for path, operations in document["paths"].items():
        if not path.startswith(f"/{key}/"):
            continue
        gvk = _kind_of(path, versions[key])
        for method, operation in operations.items():
            if gvk is not None:
                operation["x-kubernetes-group-version-kind"] = gvk
            if method in ("post", "put", "patch"):
                operation.setdefault("parameters", []).append(dict(FIELD_VALIDATION))
        paths[path] = operations
    document["paths"] = paths
    return _draft4_bounds(document)


def index(request: HttpRequest) -> HttpResponse:
    paths = {key: {"serverRelativeURL": f"/openapi/v3/{key}"} for key in _group_versions()}
    return json_response({"paths": paths})


def group_version(request: HttpRequest, key: str) -> HttpResponse:
    return json_response(group_version_document(key))
