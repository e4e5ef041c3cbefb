"""The layers' faces (STYLE "Whom we learn from": a curated public `__init__`): each declares
`__all__`, sorted and unique, naming exactly what it re-exports; the runtime's lazy face keeps its
loader table and its type-checking imports in step; every name resolves."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# face → its source; `lazy` faces load names on first use from a `_WHERE` table.
FACES = {
    "subagents.storage": ("storage/__init__.py", False),
    "subagents.storage.testing": ("storage/testing/__init__.py", False),
    "subagents.actors": ("actors/__init__.py", False),
    "subagents.runtime": ("runtime/__init__.py", True),
    "subagents.runtime.testing": ("runtime/testing/__init__.py", True),
    "subagents.runtime.hosts.cli": ("runtime/hosts/cli/__init__.py", False),
}


def _reexports(tree: ast.Module, *, type_checking: bool) -> dict[str, str]:
    """Name → relative module of every `from .x import y as y` at the top level (or inside the
    `if TYPE_CHECKING:` block when `type_checking`)."""
    body: list[ast.stmt] = list(tree.body)
    if type_checking:
        blocks = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
        body = [stmt for block in blocks for stmt in block.body]
    found = {}
    for node in body:
        if isinstance(node, ast.ImportFrom) and node.level:
            for alias in node.names:
                assert alias.asname == alias.name, f"{alias.name} is re-exported as {alias.asname}"
                found[alias.name] = "." * node.level + (node.module or "")
    return found


@pytest.mark.parametrize("face", sorted(FACES))
def test_every_face_declares_all_of_what_it_reexports(face: str) -> None:
    path, lazy = FACES[face]
    module = importlib.import_module(face)
    names = list(module.__all__)
    assert names == sorted(set(names))
    tree = ast.parse((REPO / path).read_text())
    reexported = _reexports(tree, type_checking=lazy)
    assert set(names) == set(reexported)
    if lazy:
        assert module._WHERE == reexported  # the loader's table and the checker's imports agree
    for name in names:
        assert getattr(module, name) is not None


@pytest.mark.parametrize("face", ["subagents.runtime", "subagents.runtime.testing"])
def test_a_lazy_face_refuses_a_name_it_does_not_hold(face: str) -> None:
    module = importlib.import_module(face)
    with pytest.raises(AttributeError, match=f"module '{face}' has no attribute 'nope'"):
        module.nope  # noqa: B018
    assert set(module.__all__) <= set(dir(module))
