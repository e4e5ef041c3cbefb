"""Many hosts on one PostgreSQL (issue 19, "Show"): `subagents serve` processes share the
background children a `run` host leaves to the placement queue; every child settles once and its
notice reaches the parent exactly once.

Real processes against the embedded PostgreSQL of the test session (tests/conftest.py)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from chat_driver import TIMEOUT, LineProcess
from cli_process import CLI, clean_env, write_script
from log_lines import read_all
from subagents.storage import PostgresLogStore

pytestmark = pytest.mark.pg

Json = dict[str, Any]
CHILDREN = 10


def _start(i: int) -> Json:
    return {"name": "subagent", "arguments": {"description": f"kid-{i}", "prompt": f"part {i} of the work"}}


def _script(child_delay_ms: int) -> Json:
    parent = {
        "session": "boss",
        "responses": [
            {"tool_calls": [_start(i) for i in range(1, CHILDREN + 1)]},
            {"text": "started them all"},
            *({"text": "noted"} for _ in range(CHILDREN)),  # at most one turn per notice
        ],
    }
    kids = [
        {"label": f"kid-{i}", "responses": [{"delay_ms": child_delay_ms, "text": f"part {i} done"}]}
        for i in range(1, CHILDREN + 1)
    ]
    return {"agents": [parent, *kids]}


class _Host(LineProcess):
    def claimed(self) -> list[str]:
        # every line read so far, plus what is queued (the reader thread may be ahead of `seen`)
        while not self._lines.empty():
            line = self._lines.get_nowait()
            if line is not None:
                self.seen.append(line)
        return [line.split()[1] for line in self.seen if line.startswith("claimed ")]


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    # max_active_subagents holds per family across hosts: room for every child at once here
    (tmp_path / "subagents.toml").write_text(f"max_active_subagents = {CHILDREN}\n")
    return tmp_path


@pytest.fixture
def hosts(cwd: Path, pg_url: str) -> Iterator[list[_Host]]:
    model = write_script(cwd / "script.json", _script(child_delay_ms=1500))
    started: list[_Host] = []
    try:
        for _ in range(3):
            argv = [*CLI, "serve", "--store", pg_url, "--model", model, "--capacity", "4"]
            host = _Host(argv, cwd, clean_env())
            started.append(host)
            host.expect(r"^serving host \S+ \(capacity 4\) on ")
        yield started
    finally:
        for host in started:
            if host.proc.poll() is None:
                host.proc.kill()
                host.proc.wait()


def _events(url: str, sid: str) -> list[tuple[str, Json]]:
    store = PostgresLogStore(url)
    try:
        return [(e.type, msgspec.json.decode(e.data)) for e in read_all(store, sid)]
    finally:
        store.close_store()


@pytest.mark.slow  # four processes: three serving hosts and the parent's run
def test_three_serving_hosts_share_ten_children_and_the_parent_hears_each_once(
    cwd: Path, pg_url: str, hosts: list[_Host]
) -> None:
    model = f"scripted:{cwd / 'script.json'}"
    run = subprocess.run(
        [*CLI, "run", "--store", pg_url, "--model", model, "--session", "boss", "split the work"],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert run.returncode == 0, run
    assert "Traceback" not in run.stderr

    claimed = [host.claimed() for host in hosts]
    statuses = [host.interrupt() for host in hosts]
    assert all(status == 130 and "Traceback" not in err for status, err in statuses), statuses
    # issue 27: a healthy run warns of nothing (a placement claimed while its child's lease was
    # still held elsewhere was logged as "cannot be served here (held)")
    assert not any("cannot be served here" in err for _, err in statuses), statuses
    # ten children at once, four per host: every host ran some
    assert all(claimed), claimed
    assert sorted(sum(claimed, [])) == sorted(set(sum(claimed, []))) and len(sum(claimed, [])) == CHILDREN

    events = _events(pg_url, "boss")
    catalogued = [d["child_id"] for t, d in events if t == "subagent/catalog"]
    settled = [d for t, d in events if t == "subagent/settled"]
    assert sorted(d["child_id"] for d in settled) == sorted(catalogued) == sorted(sum(claimed, []))
    assert all(d["reason_kind"] == "completed" and "delivery_id" in d for d in settled)
    notices = [
        d["message"]["source"]["sender_session_id"]
        for t, d in events
        if t == "user/message" and d["message"]["source"]["kind"] == "subagent-settled"
    ]
    assert sorted(notices) == sorted(catalogued)  # each notice delivered exactly once
    for child in catalogued:
        texts = [
            b["text"] for t, d in _events(pg_url, child) if t == "assistant/message" for b in d["message"]["content"]
        ]
        assert len(texts) == 1 and texts[0].endswith("done"), texts
    assert json.dumps(events)  # the log reads back whole
