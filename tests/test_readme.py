"""The README's code runs as written, and its commands are the ones CI and the dev script run."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from log_lines import plain_logs

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def test_storage_example_runs(tmp_path, monkeypatch, capsys) -> None:
    code = re.search(r"## Storage in a minute\n\n```python\n(.*?)```", README, re.S)
    assert code is not None
    monkeypatch.chdir(tmp_path)
    exec(compile(code.group(1), "README.md", "exec"), {})
    assert capsys.readouterr().out == "parent 1 None\n"
    assert (tmp_path / ".subagents" / "sessions" / "parent" / "session.jsonl.zst").is_file()


def test_ci_runs_the_readme_test_command() -> None:
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == "./dev test"
    assert "./dev test" in README and "./dev demo" in README


def test_actors_example_runs(tmp_path, monkeypatch, capsys) -> None:
    code = re.search(r"## Live sessions \(actors\)\n\n```python\n(.*?)```", README, re.S)
    assert code is not None
    monkeypatch.chdir(tmp_path)
    exec(compile(code.group(1), "README.md", "exec"), {})
    assert capsys.readouterr().out == "{'subagent': None}\n"
    assert (tmp_path / ".subagents" / "sessions" / "demo-parent" / "session.jsonl.zst").is_file()


def _embedding_example() -> str:
    code = re.search(r"## Embedding in a minute\n\n```python\n(.*?)```", README, re.S)
    assert code is not None
    return code.group(1)


@pytest.mark.slow  # the example run 50 times
def test_embedding_example_is_deterministic_and_rerunnable(tmp_path, monkeypatch, capsys) -> None:
    """50 runs in a row in one folder: each makes its own store, prints the same two lines and
    writes byte-identical logs (the child answers only once the parent is held, so the notice
    always lands in the same step whatever the scheduling)."""
    code = compile(_embedding_example(), "README.md", "exec")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    first: dict[str, bytes] | None = None
    for run in range(50):
        exec(code, {})
        assert capsys.readouterr().out == "the child said: HI\n['child-1']\n", f"run {run + 1}"
        roots = sorted(tmp_path.glob("subagents-*"), key=lambda p: p.stat().st_mtime_ns)
        assert len(roots) == run + 1
        logs = plain_logs(roots[-1])
        assert set(logs) == {"parent", "child-1"}
        if first is None:
            first = logs
        assert logs == first, f"run {run + 1} wrote other logs than run 1"


def test_embedding_example_imports_only_the_runtime_face() -> None:
    """The embedder's imports come from `subagents.runtime` itself, never from its modules."""
    imports = [line for line in _embedding_example().splitlines() if line.startswith(("import ", "from "))]
    ours = [line for line in imports if "subagents" in line]
    assert ours == [
        "from subagents.runtime import CountingIds, ScenarioClock, ScriptedModel, load_script, open_runtime"
    ]


def test_modules_are_named_for_what_they_hold() -> None:
    """The subagent service is `delegation` (not the stutter `subagents.runtime.subagents`), the
    script file format is `script_format` and the model that plays it `scripted_model`."""
    import importlib.util

    for gone in ("subagents.runtime.subagents", "subagents.runtime.models.script", "subagents.runtime.models.scripted"):
        assert importlib.util.find_spec(gone) is None, gone
    for name in (
        "subagents.runtime.delegation.service",
        "subagents.runtime.testing.script_format",
        "subagents.runtime.testing.scripted_model",
    ):
        assert importlib.util.find_spec(name) is not None, name
