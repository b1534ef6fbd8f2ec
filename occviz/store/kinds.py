"""The kinds of versioned object, in one list: whatever serves, shows or makes objects reads it.

The API serves every kind here (api/kinds.py adds each one's JSON), the watch page shows
the history of an object of any of them (`/watch/<plural>/<namespace>/<name>/`), a job
page links the objects of each kind its job made, and `serve` makes each kind's demo
objects. A new kind is its model, its entry here and its API JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from occviz.store.models import Counter, Deployment, Lease, Pod, ResourceQuota, VersionedObject


@dataclass(frozen=True)
class ObjectKind:
    """One kind of object: its model, how the Kubernetes API names it, and what a list of them shows."""

    model: type[VersionedObject]
    short_names: tuple[str, ...] = ()
    """What kubectl also takes for the resource (`kubectl get po`)."""
    shown: tuple[str, ...] = ()
    """The fields that say most about one of them: each version in its history is worded by these (all if none)."""
    demo: tuple[Mapping[str, Any], ...] = ()
    """Objects `serve` makes in the demo namespace, to look at and to contend on: a name and fields each."""

    @property
    def kind(self) -> str:
        return self.model.api_kind

    @property
    def plural(self) -> str:
        """The resource, as in API paths, in `Change.resource` and in the watch page's path."""
        return self.model.kind_plural

    @property
    def group(self) -> str:
        """The API group; "" is the core group."""
        return self.model.api_group

    @property
    def api_version(self) -> str:
        """`apiVersion` of its objects: "v1" for the core group, "<group>/v1" otherwise."""
        return f"{self.group}/{self.model.api_version}" if self.group else self.model.api_version

    @property
    def path(self) -> str:
        """The group version's path: /api/v1 or /apis/<group>/v1."""
        return f"/apis/{self.api_version}" if self.group else f"/api/{self.api_version}"

    def object_path(self, namespace: str, name: str) -> str:
        """One object's path in the API."""
        return f"{self.path}/namespaces/{namespace}/{self.plural}/{name}"


_GPU = "requests.nvidia.com/gpu"

KINDS: Final[tuple[ObjectKind, ...]] = (
    ObjectKind(Pod, ("po",), ("phase",), ({"name": "trainer-0", "requests": {_GPU: 1}},)),
    ObjectKind(ResourceQuota, ("quota",), ("used",), ({"name": "gpu-quota", "hard": {_GPU: 1}, "used": {_GPU: 0}},)),
    ObjectKind(Deployment, ("deploy",), (), ({"name": "web", "replicas": 2},)),
    ObjectKind(Lease, (), ("holder_identity",), ({"name": "leader", "lease_duration_seconds": 15},)),
    ObjectKind(Counter, ("cnt",), ("value",), ({"name": "hot"}, {"name": "warm"}, {"name": "cold"})),
)

BY_PLURAL: Final[dict[str, ObjectKind]] = {kind.plural: kind for kind in KINDS}


def kind_of(model: type[VersionedObject]) -> ObjectKind:
    """The entry of `model`'s kind (LookupError for a model that is not one)."""
    try:
        return BY_PLURAL[model.kind_plural]
    except KeyError:
        raise LookupError(f"{model.__name__} is not a kind of object (occviz/store/kinds.py)") from None
