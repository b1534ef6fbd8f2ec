"""The store is the ground floor, the jobs stand on it: neither imports the layers above.

Imports are read from the source with `ast`, wherever they stand: at the top, inside
functions, under `if TYPE_CHECKING:`. Relative imports are resolved against the module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "occviz"
ABOVE_THE_STORE = ("occviz.jobs", "occviz.live", "occviz.web", "occviz.api", "occviz.scenarios", "occviz.lessons")
ABOVE_THE_JOBS = ("occviz.live", "occviz.web", "occviz.api", "occviz.scenarios", "occviz.lessons")
# The top floor: only the routes import it (settings name it as an app, a string).
TOP = ("occviz.lessons",)
MAY_IMPORT_THE_TOP = {"urls.py", "lessons"}


def package_of(path: Path) -> str:
    """The package a relative import in `path` starts from."""
    parts = path.relative_to(ROOT).parts
    return ".".join(parts[:-1])


def imports_in(source: str, package: str) -> Iterator[tuple[int, str]]:
    """(line, module) of every import in `source`, `from x import y` giving both x and x.y."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def reaching_above(folder: str, above: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        for line, name in imports_in(path.read_text(), package_of(path)):
            if any(name == layer or name.startswith(f"{layer}.") for layer in above):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return found


def test_the_store_imports_nothing_above_it() -> None:
    assert reaching_above("store", ABOVE_THE_STORE) == []


def test_the_jobs_import_nothing_above_them() -> None:
    assert reaching_above("jobs", ABOVE_THE_JOBS) == []


def test_nothing_but_the_routes_imports_the_lessons() -> None:
    found = []
    for path in sorted(PACKAGE.iterdir()):
        if path.name in MAY_IMPORT_THE_TOP or not (path.is_dir() or path.suffix == ".py"):
            continue
        if path.is_dir():
            found += reaching_above(path.name, TOP)
        else:
            found += [
                f"{path.name}:{line} imports {name}"
                for line, name in imports_in(path.read_text(), "occviz")
                if name == TOP[0] or name.startswith(f"{TOP[0]}.")
            ]
    assert found == []


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from occviz.jobs.models import Job\n", "occviz.jobs.models"),
        ("def f():\n    import occviz.web.views\n", "occviz.web.views"),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from occviz.api import kinds\n", "occviz.api.kinds"),
        ("from ..live import frames\n", "occviz.live.frames"),
        ("from occviz import scenarios\n", "occviz.scenarios"),
    ],
)
def test_an_import_above_is_found_wherever_it_stands(source: str, found: str) -> None:
    assert found in {name for _, name in imports_in(source, "occviz.store")}
