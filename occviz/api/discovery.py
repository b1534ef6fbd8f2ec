"""Discovery, as kubectl reads it before anything else: /api, /apis, each group version, /version.

kubectl asks for aggregated discovery (apidiscovery.k8s.io/v2) and accepts the plain
documents served here (APIVersions, APIGroupList, APIResourceList) in its place.
Namespaces are not stored: a namespace exists while an object is in it ("default" always).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from occviz.api.kinds import KINDS, Kind
from occviz.api.status import ApiError

GIT_VERSION = "v1.32.0-occviz"
OWN_GROUP = "occviz.dev"
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
# Served by occviz.api.jobs, in the project's own group beside the counters.
JOB_RESOURCE = {
    "name": "jobs",
    "singularName": "job",
    "namespaced": True,
    "kind": "Job",
    "verbs": ["create", "delete", "get", "list"],
    "categories": ["occviz"],
}
NAMESPACE_RESOURCE = {
    "name": "namespaces",
    "singularName": "namespace",
    "namespaced": False,
    "kind": "Namespace",
    "verbs": ["get", "list"],
    "shortNames": ["ns"],
}


def version() -> dict[str, Any]:
    return {
        "major": "1",
        "minor": "32",
        "gitVersion": GIT_VERSION,
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.23",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(request: HttpRequest) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": request.get_host()}],
    }


def _groups() -> list[str]:
    return list(dict.fromkeys(kind.group for kind in KINDS if kind.group))


def _group(name: str) -> dict[str, Any]:
    version = {"groupVersion": f"{name}/v1", "version": "v1"}
    return {"name": name, "versions": [version], "preferredVersion": version}


def group_list() -> dict[str, Any]:
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(name) for name in _groups()]}


def group(name: str) -> dict[str, Any]:
    if name not in _groups():
        raise ApiError(404, "the server could not find the requested resource")
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name)}


def _resource(kind: Kind) -> dict[str, Any]:
    resource: dict[str, Any] = {
        "name": kind.plural,
        "singularName": kind.kind.lower(),
        "namespaced": True,
        "kind": kind.kind,
        "verbs": VERBS,
    }
    if kind.short_names:
        resource["shortNames"] = list(kind.short_names)
    if kind.group == OWN_GROUP:
        resource["categories"] = ["occviz"]
    return resource


def resource_list(group_name: str) -> dict[str, Any]:
    """The APIResourceList of `group_name` ("" for the core group, /api/v1)."""
    if group_name and group_name not in _groups():
        raise ApiError(404, "the server could not find the requested resource")
    resources = [_resource(kind) for kind in KINDS if kind.group == group_name]
    if not group_name:
        resources.insert(0, NAMESPACE_RESOURCE)
    if group_name == OWN_GROUP:
        resources.append(JOB_RESOURCE)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group_name}/v1" if group_name else "v1",
        "resources": resources,
    }


def namespaces() -> list[str]:
    """The namespaces that hold an object, and "default"."""
    names = {"default"}
    for kind in KINDS:
        names.update(kind.model._default_manager.values_list("namespace", flat=True).distinct())
    return sorted(names)


def namespace_json(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def namespace_list() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "NamespaceList",
        "metadata": {"resourceVersion": "1"},
        "items": [namespace_json(name) for name in namespaces()],
    }


def namespace(name: str) -> dict[str, Any]:
    if name not in namespaces():
        raise ApiError(404, f'namespaces "{name}" not found', details={"name": name, "kind": "namespaces"})
    return namespace_json(name)
