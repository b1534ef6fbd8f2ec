"""`{% scenario_part spec "launch" %}`: a scenario's own partial on a generic page, if it declares one.

A scenario's template (its `state_template`) may hold partials besides `state`: the launch
page shows its `launch` partial above the form (step mode's built-in scripts, say). A scenario
without one shows nothing there, so no page switches on a scenario's name.
"""

from __future__ import annotations

from typing import Any

from django import template
from django.template.exceptions import TemplateDoesNotExist
from django.template.loader import get_template
from django.utils.safestring import SafeString

register = template.Library()


@register.simple_tag(takes_context=True)
def scenario_part(context: template.Context, spec: Any, name: str) -> str:
    """The scenario's `name` partial rendered with this page's context, or '' when it has none."""
    source = getattr(spec, "state_template", "")
    if not source:
        return ""
    try:
        part = get_template(f"{source}#{name}")
    except TemplateDoesNotExist:
        return ""
    values = {str(key): value for key, value in context.flatten().items()}
    return SafeString(part.render(values, context.get("request")))
