"""A step job's script, from its parameters: a built-in one by name, or one written in the launch form."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from occviz.steps.builtin import scripts
from occviz.steps.script import Script, parse

BY_HAND, WRITTEN_ORDER = "by hand", "written order"
"""The paces: each step when a person asks for it, or the whole script by itself."""
DEFAULT_SCRIPT = "lost-update"


def script_of(params: Mapping[str, Any]) -> tuple[Script, str | None]:
    """The job's script, and the question its built-in asks (None for a script written in the form)."""
    if params.get("text"):
        return parse(params["text"]), None
    builtin = scripts()[params.get("script") or DEFAULT_SCRIPT]
    return parse(builtin.text), builtin.question
