"""The Deployment the controllers share: the field each one owns, and the object as it starts.

Controller A owns the first field, B the second, ...: a column of the Deployment, or a
key in one of its JSON columns, holding the controller's reconcile number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from occviz.store.models import Deployment

OBJECT_NAME = "web"
MIN_CONTROLLERS = 2
UNREADABLE = -1
"""An owned field's value when it is missing or not a number: an outside write put it so (no reconcile number is)."""


@dataclass(frozen=True)
class OwnedField:
    """The one field of the Deployment a controller reconciles: a column, or a key in a JSON column."""

    path: str
    """As `kubectl get -o yaml` shows where it lives: `status.observedGeneration`, `metadata.labels[...]`."""
    column: str
    key: str = ""

    def get(self, content: Mapping[str, Any]) -> int:
        # Labels and annotations are strings in Kubernetes; the value is the controller's reconcile number.
        try:
            return int(content[self.column][self.key] if self.key else content[self.column])
        except (KeyError, TypeError, ValueError):
            return UNREADABLE

    def put(self, content: dict[str, Any], value: int) -> None:
        if not self.key:
            content[self.column] = value
        elif self.column in ("labels", "annotations"):
            content[self.column] = {**content[self.column], self.key: str(value)}
        else:
            content[self.column] = {**content[self.column], self.key: value}


# Controller A owns the first, B the second, ...
FIELDS = (
    OwnedField("status.observedGeneration", "status", "observedGeneration"),
    OwnedField("spec.replicas", "replicas"),
    OwnedField("metadata.labels[occviz.dev/revision]", "labels", "occviz.dev/revision"),
    OwnedField("metadata.annotations[occviz.dev/last-sync]", "annotations", "occviz.dev/last-sync"),
    OwnedField("status.availableReplicas", "status", "availableReplicas"),
    OwnedField("metadata.labels[occviz.dev/tier-generation]", "labels", "occviz.dev/tier-generation"),
    OwnedField("metadata.annotations[occviz.dev/audit]", "annotations", "occviz.dev/audit"),
    OwnedField("status.updatedReplicas", "status", "updatedReplicas"),
)
COLUMNS = ("replicas", "labels", "annotations", "status")
MAX_CONTROLLERS = len(FIELDS)


def controller_name(number: int) -> str:
    return f"controller {chr(ord('A') + number - 1)}"


def initial_content(controllers: int) -> dict[str, Any]:
    content: dict[str, Any] = {
        "replicas": 0,
        "labels": {"app": OBJECT_NAME},
        "annotations": {},
        "status": {},
    }
    for owned in FIELDS[:controllers]:
        owned.put(content, 0)
    return content


def stored(row: int) -> tuple[int, dict[str, Any]]:
    """The Deployment as stored now: its version, and its columns."""
    deployment = Deployment.objects.get(pk=row)
    return deployment.resource_version, {column: getattr(deployment, column) for column in COLUMNS}
