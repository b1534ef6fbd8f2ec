"""An object's fields as `kubectl get -o yaml` prints them: nested maps and lists indented, one value a line.

The watch page shows an object's content with it (a quota's `hard` and `used`, a pod's
`requests`), on first paint and in every poll, so the browser only places the text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

# Text YAML would read as something else (a number, a boolean, null, a map) or not at all: quoted.
_PLAIN = re.compile(r"[A-Za-z_/][\w./@+-]*(?: [\w./@+()-]+)*")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "~"}


def yaml_text(fields: Mapping[str, Any]) -> str:
    return "\n".join(_lines(fields, 0))


def _lines(value: Mapping[str, Any], depth: int) -> list[str]:
    pad = "  " * depth
    lines: list[str] = []
    for key, item in value.items():
        label = _scalar(str(key))
        if isinstance(item, Mapping) and item:
            lines += [f"{pad}{label}:", *_lines(item, depth + 1)]
        elif isinstance(item, list) and item:
            lines += [f"{pad}{label}:", *_items(item, depth + 1)]
        else:
            lines.append(f"{pad}{label}: {_scalar(item)}")
    return lines


def _items(values: list[Any], depth: int) -> list[str]:
    pad = "  " * depth
    lines: list[str] = []
    for item in values:
        if isinstance(item, Mapping) and item:
            first, *rest = _lines(item, depth + 1)
            lines += [f"{pad}- {first.lstrip()}", *rest]
        else:
            lines.append(f"{pad}- {_scalar(item)}")
    return lines


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, list):
        return "[]"
    text = str(value)
    return text if _PLAIN.fullmatch(text) and text.lower() not in _RESERVED else json.dumps(text)
