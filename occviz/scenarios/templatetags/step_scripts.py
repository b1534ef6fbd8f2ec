"""`{% step_scripts as scripts %}`: step mode's built-in scripts for its launch page, grouped.

Each with its name, title, the question to ask the class and its text, so that a teacher reads
a script before running it and can start one of their own from a copy.
"""

from __future__ import annotations

from typing import Any

from django import template

from occviz.steps.builtin import scripts

register = template.Library()

HERMITAGE = "hermitage-"


@register.simple_tag
def step_scripts() -> list[dict[str, Any]]:
    """[{title, scripts: [{name, title, question, text, isolation}]}]: the classics, then Hermitage's tests."""
    groups: dict[str, list[dict[str, Any]]] = {"Classics": [], "Hermitage's tests": []}
    for name, builtin in scripts().items():
        group = "Hermitage's tests" if name.startswith(HERMITAGE) else "Classics"
        groups[group].append(
            {
                "name": name,
                "title": getattr(builtin, "title", name),
                "question": getattr(builtin, "question", ""),
                "text": getattr(builtin, "text", ""),
                "isolation": getattr(builtin, "isolation", ""),
            }
        )
    return [{"title": title, "scripts": found} for title, found in groups.items() if found]
