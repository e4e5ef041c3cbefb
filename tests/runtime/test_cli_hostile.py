"""The read-only commands over hostile data (issue 13 item 2b): a garbled `index.sqlite3` and
child logs with hostile lines never make `sessions`, `show`, `children` or `agents` print a
traceback; each exits 0, or 1/2 with its message (`subagents.runtime.hosts.cli:main`, in process).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import hypothesis.strategies as st
import pytest
from clocks import T
from descriptors import descriptor
from garble import garble
from hypothesis import HealthCheck, Phase, given, settings
from log_lines import encode_header, header, json_line, new_log_file, zstd_frame
from subagents.runtime.hosts.cli import main

HOSTILE = [
    b'{"seq":2,"type":"turn/end","time":1,"data":{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}}\n",
    b'{"seq":2,"type":"turn/end","time":1,"data":{"x":' + b"[" * 1_000 + b"]" * 1_000 + b"}}\n",
    b'{"seq":2,"type":"turn/start","time":1,"data":{"turn":1' + b"0" * 50_000 + b"}}\n",
    b'{"seq":2,"type":"turn/start","time":1,"data":{"turn":2,"\xc3\x28":1}}\n',
    b'{"seq":2,"type":"turn/start","time":1,"data":{"turn":2}}\x00\n',
    b'{"seq":2,"type":"user/message","time":1,"data":{"turn":1,"step":1,"message":{"role":"user","content":[],'
    b'"source":{"kind":"user"}}},"surface_op":"append"}\n',
    b'{"seq":2,"type":"turn/sta',  # a torn tail: not damage
]


def _write(root: Path, sid: str, body: bytes, *, parent: str | None, compression: str, created_at: int) -> None:
    session_header = header(
        sid,
        created_at,
        parent_session=parent,
        origin="subagent" if parent else None,
        delegation_depth=1 if parent else 0,
    )
    head = encode_header(session_header)
    log = new_log_file(root, sid, compression)
    if compression == "none":
        log.write_bytes(head + body)
    else:
        cut = body.rfind(b"\n") + 1
        tail = zstd_frame(body[cut:])[:-6] if cut < len(body) else b""  # a torn last frame
        log.write_bytes(zstd_frame(head) + zstd_frame(body[:cut]) + tail)


def build(root: Path, hostile: list[tuple[int, str]]) -> list[str]:
    _write(root, "p", json_line(0, "turn/start", {"turn": 1}), parent=None, compression="none", created_at=T)
    ids = ["p"]
    for i, (which, compression) in enumerate([(None, "none"), (None, "zstd"), *hostile]):
        sid = f"c{i}"
        body = json_line(0, "subagent/descriptor", descriptor(sid)) + json_line(1, "turn/start", {"turn": 1})
        if which is not None:
            body += HOSTILE[which]
        _write(root, sid, body, parent="p", compression=compression, created_at=T + 1 + i)
        ids.append(sid)
    return ids


COMMANDS = [
    ["sessions"],
    ["sessions", "--json"],
    ["children", "p"],
    ["children", "p", "--json"],
    ["children", "p", "--descendants"],
    ["agents", "p"],
]


def run_all(
    root: Path, ids: list[str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture | None = None
) -> dict[tuple[str, ...], tuple[int, str, str]]:
    out = {}
    for args in [*COMMANDS, *(["show", sid] for sid in ids)]:
        if caplog is not None:
            caplog.clear()
        code = main([*args, "--root", str(root)])
        captured = capsys.readouterr()
        if caplog is not None:  # one warning line at most about the index, per command
            warnings = [r for r in caplog.records if r.name.endswith("index") and r.levelno >= logging.WARNING]
            assert len(warnings) <= 1, (args, [r.getMessage() for r in warnings])
        assert code in (0, 1, 2), (args, code, captured.err)
        assert "Traceback" not in captured.err and "Traceback" not in captured.out, (args, captured.err)
        out[tuple(args)] = (code, captured.out, captured.err)
    return out


@pytest.mark.slow  # every read-only command as a process, per hostile child
@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("which", range(len(HOSTILE)))
def test_read_only_commands_over_a_hostile_child(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], which: int, compression: str
) -> None:
    ids = build(tmp_path, [(which, compression)])
    out = run_all(tmp_path, ids, capsys)
    code, text, _ = out[("children", "p", "--json")]
    assert code == 0
    rows = {row["id"]: row for row in json.loads(text)}
    assert rows["c0"]["kind"] == rows["c1"]["kind"] == "child"  # healthy siblings list as they are
    torn = not HOSTILE[which].endswith(b"\n")
    assert rows["c2"]["kind"] == ("child" if torn else "diagnostic")
    if not torn:
        assert rows["c2"]["reason"] == "corrupt"
        assert out[("show", "c2")][0] != 0  # refused, with a message
    assert out[("show", "c0")][0] == 0


@pytest.mark.slow
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(
    hostile=st.lists(st.tuples(st.integers(0, len(HOSTILE) - 1), st.sampled_from(["none", "zstd"])), max_size=3),
    garbles=st.lists(st.tuples(st.integers(0, 1 << 16), st.binary(min_size=1, max_size=16)), min_size=1, max_size=8),
)
def test_fuzz_read_only_commands_over_a_garbled_index(
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    hostile: list[tuple[int, str]],
    garbles: list[tuple[int, bytes]],
) -> None:
    root = tmp_path_factory.mktemp("root")
    ids = build(root, hostile)
    before = run_all(root, ids, capsys)  # builds the index
    index = root / "index.sqlite3"
    garble(index, garbles)
    with caplog.at_level(logging.WARNING):
        after = run_all(root, ids, capsys, caplog)
    # The index is a cache: the same answers (exit codes and tables) with it garbled.
    assert {k: v[:2] for k, v in after.items()} == {k: v[:2] for k, v in before.items()}
