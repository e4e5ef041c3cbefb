"""The README's code runs as written, and its commands are the ones CI and the dev script run."""

from __future__ import annotations

import re
from pathlib import Path

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


def test_embedding_example_runs(tmp_path, monkeypatch, capsys) -> None:
    code = re.search(r"## Embedding in a minute\n\n```python\n(.*?)```", README, re.S)
    assert code is not None
    monkeypatch.chdir(tmp_path)
    exec(compile(code.group(1), "README.md", "exec"), {})
    assert capsys.readouterr().out == "the child said: HI\n['child-1']\n"
    assert (tmp_path / ".subagents" / "sessions" / "child-1" / "session.jsonl.zst").is_file()
