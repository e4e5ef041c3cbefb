"""`subagents stop ID --tree` over two hosts on one PostgreSQL (issue 27, item 5): a `run` hosts
the root, a `serve` host runs its background child `Mid` and Mid's child `Leaf` (both placed);
the operator's `stop Mid --tree` stops both for good. Then the serving host is SIGKILLed and a
new one started, and the root runs again with a new child: the new host's sweep and claims pass
(it served the new child), and nothing in the stopped subtree ran again; each stopped session
settled once. A later `send` to Mid starts it again.

Real processes against the embedded PostgreSQL of the test session (tests/conftest.py)."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from chat_driver import TIMEOUT, LineProcess
from cli_process import CLI, clean_env, write_script
from log_lines import read_all
from subagents.storage import PostgresLogStore, SessionNotFound

pytestmark = pytest.mark.pg

Json = dict[str, Any]


def _spawn(label: str) -> Json:
    return {"tool_calls": [{"name": "subagent", "arguments": {"description": label, "prompt": "work"}}]}


_HELD = {"wait_for": {"steered": True}, "text": "never"}  # a model call that waits for ever

_SERVED = {
    "agents": [
        {"label": "Mid", "responses": [_spawn("Leaf"), _HELD]},
        {"label": "Leaf", "responses": [_HELD]},
        {"label": "Other", "responses": [{"text": "other done"}]},
    ]
}


def _events(url: str, sid: str) -> list[tuple[str, Json]]:
    store = PostgresLogStore(url)
    try:
        return [(e.type, msgspec.json.decode(e.data)) for e in read_all(store, sid)]
    except SessionNotFound:
        return []
    finally:
        store.close_store()


def _until(holds: Callable[[], bool], what: str) -> None:
    """A bounded poll of rows other processes write (no event crosses processes)."""
    deadline = time.monotonic() + TIMEOUT
    while not holds():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def _started(events: list[tuple[str, Json]]) -> list[str]:
    out = []
    for kind, data in events:
        if kind == "tool/result":
            for block in data["message"]["content"]:
                for part in block.get("content", []):
                    m = re.fullmatch(r"started subagent (\S+)", part.get("text") or "")
                    if m:
                        out.append(m.group(1))
    return out


def _serve(cwd: Path, url: str) -> LineProcess:
    model = write_script(cwd / "served.json", _SERVED)
    host = LineProcess([*CLI, "serve", "--store", url, "--model", model, "--capacity", "4"], cwd, clean_env())
    host.expect(r"^serving host \S+ \(capacity 4\) on ")
    return host


def _cli(cwd: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args[:1], "--store", url, *args[1:]],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[list[LineProcess]]:
    (tmp_path / "subagents.toml").write_text("max_depth = 2\n")
    started: list[LineProcess] = []
    try:
        yield started
    finally:
        for host in started:
            if host.proc.poll() is None:
                host.proc.kill()
                host.proc.wait()


@pytest.mark.slow  # a run, two serving hosts one after the other, the operator's stop and send
def test_stop_tree_over_two_hosts_survives_a_host_restart(
    tmp_path: Path, pg_url: str, hosts: list[LineProcess]
) -> None:
    hosts.append(_serve(tmp_path, pg_url))
    boss = {
        "session": "boss",
        "responses": [_spawn("Mid"), {"wait_for": {"settled": "Mid"}, "text": "mid settled"}, {"text": "noted"}],
    }
    model = write_script(tmp_path / "boss.json", {"agents": [boss]})
    run = LineProcess(
        [*CLI, "run", "--store", pg_url, "--model", model, "--session", "boss", "go"], tmp_path, clean_env()
    )
    hosts.append(run)
    _until(lambda: bool(_started(_events(pg_url, "boss"))), "the root started Mid")
    (mid,) = _started(_events(pg_url, "boss"))
    _until(lambda: bool(_started(_events(pg_url, mid))), "Mid started Leaf")
    (leaf,) = _started(_events(pg_url, mid))
    _until(lambda: [k for k, _ in _events(pg_url, leaf)].count("step/start") == 1, "Leaf waits on its model")

    stop = _cli(tmp_path, pg_url, "stop", mid, "--tree")
    assert (stop.returncode, stop.stderr) == (0, ""), stop
    assert stop.stdout == f"stopped 2 sessions: {mid} and its descendants {leaf}\n"
    run.expect(r"^noted$")  # the notice turn after its settlement: the run prints its last answer
    assert run.proc.wait(timeout=TIMEOUT) == 0

    hosts[0].proc.send_signal(signal.SIGKILL)  # the serving host dies; a new one takes its place
    hosts[0].proc.wait(timeout=TIMEOUT)
    before = {sid: _events(pg_url, sid) for sid in (mid, leaf)}
    for sid in (mid, leaf):
        assert [d for k, d in before[sid] if k == "session/stopped"][0]["tree"] is True
        assert [d["reason"] for k, d in before[sid] if k == "turn/end"] == [{"kind": "aborted", "cause": "user"}]
    restarted = _serve(tmp_path, pg_url)
    hosts.append(restarted)

    # The root again, with a new child: the new host sweeps before it claims, so once the new
    # child is done its sweep has passed the stopped ones.
    again = {
        "session": "boss",
        "responses": [_spawn("Other"), {"wait_for": {"settled": "Other"}, "text": "done"}, {"text": "noted"}],
    }
    rerun = _cli(
        tmp_path,
        pg_url,
        "run",
        "--model",
        write_script(tmp_path / "again.json", {"agents": [again]}),
        "--session",
        "boss",
        "again",
    )
    assert rerun.returncode == 0, rerun.stderr
    restarted.expect(r"^finished \S+$")
    assert {sid: _events(pg_url, sid) for sid in (mid, leaf)} == before
    assert not [line for line in restarted.seen if mid in line or leaf in line], restarted.seen
    settled = [d["child_id"] for k, d in _events(pg_url, "boss") if k == "subagent/settled"]
    assert settled.count(mid) == 1 and leaf not in settled
    assert [d["child_id"] for k, d in _events(pg_url, mid) if k == "subagent/settled"] == [leaf]
    notices = [
        d["message"]["source"]["sender_session_id"]
        for k, d in _events(pg_url, "boss")
        if k == "user/message" and d["message"]["source"]["kind"] == "subagent-settled"
    ]
    assert notices.count(mid) == 1  # the root heard of it once

    # An explicit message starts Mid again; Leaf stays stopped.
    back = write_script(tmp_path / "back.json", {"agents": [{"responses": [{"text": "back at work"}]}]})
    sent = _cli(tmp_path, pg_url, "send", "--model", back, mid, "resume please")
    assert sent.returncode == 0, sent.stderr
    assert "back at work" in sent.stdout
    assert _events(pg_url, leaf) == before[leaf]
