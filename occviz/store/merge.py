"""Three-way merge of an object's fields: what a writer read, what they changed, what is stored now.

A writer whose compare-and-swap was refused read the object at some version (the base),
changed some of its fields (theirs), and meanwhile someone else wrote (stored). A field
only they changed can go onto the stored version as it is; a field the other writer also
changed, to something else, is a real clash that a person settles; a field only the other
writer changed stays as stored. Values are compared as JSON, the way `writes.fields_of`
gives them, so a datetime in another time zone is not taken for a change.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

MINE = "mine"
STORED = "stored"


def as_json(value: Any) -> Any:
    """`value` as `writes.fields_of` gives a stored one: JSON, datetimes in UTC."""
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        value = value.astimezone(datetime.UTC)
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


@dataclass(frozen=True)
class FieldMerge:
    """One field across the three versions."""

    name: str
    base: Any
    mine: Any
    stored: Any
    mine_changed: bool

    @property
    def stored_changed(self) -> bool:
        return self.stored != self.base

    @property
    def clash(self) -> bool:
        """Both changed it, to different values: a person chooses."""
        return self.mine_changed and self.stored_changed and self.mine != self.stored

    @property
    def goes_through(self) -> bool:
        """Only the writer changed it (or both to the same value): their value applies as it is."""
        return self.mine_changed and not self.clash and self.mine != self.stored


def three_way(base: Mapping[str, Any], mine: Mapping[str, Any], stored: Mapping[str, Any]) -> list[FieldMerge]:
    """Every field of `base`, with `mine` holding only the fields the writer changed (JSON values)."""
    return [
        FieldMerge(
            name=name,
            base=base_value,
            mine=mine.get(name, base_value),
            stored=stored.get(name),
            mine_changed=name in mine,
        )
        for name, base_value in base.items()
    ]


def merged_changes(fields: list[FieldMerge], choices: Mapping[str, str]) -> dict[str, Any]:
    """The writer's changes to write onto the stored version.

    A clash goes in only if `choices[name]` is MINE; any other answer keeps the stored value.
    """
    return {
        field.name: field.mine
        for field in fields
        if field.goes_through or (field.clash and choices.get(field.name) == MINE)
    }
