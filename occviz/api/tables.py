"""Lists and watches as tables, as kubectl asks for them, so it prints the columns a cluster's would.

kubectl asks `Accept: application/json;as=Table;v=v1;g=meta.k8s.io, application/json`; given
a plain list it prints only NAME and AGE, where a cluster prints a Lease's HOLDER too. A
Table carries its columns, each row's cells and the row's object's metadata.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.http import HttpRequest

from occviz.api.kinds import Kind


def wants_table(request: HttpRequest) -> bool:
    return "as=Table" in request.headers.get("Accept", "")


def human_duration(seconds: float) -> str:
    """An age as kubectl prints one (apimachinery's HumanDuration): 45s, 3m20s, 25m, 5h10m, 3d4h."""
    s = int(seconds)
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    years = days // 365
    if days < 365 * 8:
        return f"{years}y{days % 365}d" if days % 365 else f"{years}y"
    return f"{years}y"


def _cell(obj: dict[str, Any], path: str) -> Any:
    value: Any = obj
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return "<none>" if value is None or value == "" else value


def table(kind: Kind, objects: Iterable[dict[str, Any]], resource_version: str) -> dict[str, Any]:
    """A meta.k8s.io/v1 Table of `objects` (the kind's JSON): Name, the kind's own columns, Age."""
    now = datetime.now(UTC)
    columns = [
        {"name": "Name", "type": "string", "format": "name", "description": "The object's name.", "priority": 0},
        *(
            {"name": name, "type": "string", "format": "", "description": f"`{path}`", "priority": 0}
            for name, path in kind.columns
        ),
        {"name": "Age", "type": "string", "format": "", "description": "Since it was created.", "priority": 0},
    ]
    rows = []
    for obj in objects:
        metadata = obj["metadata"]
        created = datetime.fromisoformat(metadata["creationTimestamp"])
        cells = [metadata["name"], *(_cell(obj, path) for _, path in kind.columns)]
        cells.append(human_duration((now - created).total_seconds()))
        rows.append(
            {
                "cells": cells,
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata},
            }
        )
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns,
        "rows": rows,
    }
