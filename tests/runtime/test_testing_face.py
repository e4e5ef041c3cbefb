"""The test bed's face (`subagents.runtime.testing`, issue 26 item 4): one table of lazy names,
the type-checking imports in step with it, and importing the scripted model does not pull in
the scenario runner."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import subagents.runtime.testing as face


def _checked_imports() -> dict[str, str]:
    tree = ast.parse(Path(face.__file__).read_text(encoding="utf-8"))
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom)
                for alias in stmt.names:
                    names[alias.asname or alias.name] = "." * stmt.level + (stmt.module or "")
    return names


def test_the_type_checking_imports_are_the_table() -> None:
    assert _checked_imports() == face._WHERE
    assert face.__all__ == sorted(face._WHERE)


def test_every_name_loads_from_where_the_table_says() -> None:
    for name, where in face._WHERE.items():
        module = importlib.import_module(where, face.__name__)
        assert getattr(face, name) is getattr(module, name)


def test_the_scripted_model_does_not_import_the_scenario_runner() -> None:
    code = (
        "import sys, subagents.runtime.testing.scripted_model;"
        "print('subagents.runtime.testing.scenario' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
