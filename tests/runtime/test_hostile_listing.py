"""Damage is reported, never raised (issue 13 item 2b), through the session query and the listing.

A root holds a parent, healthy children and children whose logs hold hostile lines (nesting
deeper than any recursion limit, numbers no type holds, invalid UTF-8, NUL bytes, truncated
zstd frames, invalid payloads), and its `index.sqlite3` is garbled at random bytes. Then
`SessionQuery.list_sessions`/`observe_session` and `ListingService.list_children` run: nothing
escapes but the documented typed errors, every hostile child lists as `diagnostic corrupt` and
every healthy sibling lists as it is.
"""

from __future__ import annotations

from pathlib import Path

import hypothesis.strategies as st
import pytest
import trio
from clocks import T, ticking_ms
from descriptors import descriptor
from garble import garble
from hypothesis import HealthCheck, given, settings
from log_lines import encode_header, header, json_line, new_log_file, zstd_frame
from subagents.runtime import open_runtime
from subagents.runtime.foundation.errors import SessionQueryError

now_ms = ticking_ms(T + 10_000)


def _own(label: str) -> bytes:
    return json_line(0, "subagent/descriptor", descriptor(label)) + json_line(1, "turn/start", {"turn": 1})


def _deep(depth: int) -> bytes:
    return b'{"turn":1,"x":' + b"[" * depth + b"]" * depth + b"}"


# Lines after a valid descriptor (seq 0) and turn/start (seq 1): each makes its log corrupt.
HOSTILE: dict[str, bytes] = {
    "deep-1k": b'{"seq":2,"type":"turn/end","time":1,"data":' + _deep(1_000) + b"}\n",
    "deep-100k": b'{"seq":2,"type":"turn/end","time":1,"data":' + _deep(100_000) + b"}\n",
    "deep-unclosed": b'{"seq":2,"type":"turn/end","time":1,"data":{"x":' + b"[" * 100_000 + b"\n",
    "huge-int": b'{"seq":2,"type":"turn/start","time":1,"data":{"turn":1' + b"0" * 50_000 + b"}}\n",
    "huge-time": b'{"seq":2,"type":"turn/start","time":1' + b"0" * 400 + b',"data":{"turn":1}}\n',
    "invalid-utf8": b'{"seq":2,"type":"turn/start","time":1,"data":{"turn":2,"\xc3\x28":1}}\n',
    "nul": b'{"seq":2,"type":"turn/start","time":1,"data":{"turn":2}}\x00\x00\n',
    "user-message-without-id": json_line(
        2,
        "user/message",
        {"turn": 1, "step": 1, "message": {"role": "user", "content": [], "source": {"kind": "user"}}},
        surface_op="append",
    ),
    "turn-is-a-str": json_line(2, "turn/start", {"turn": "2"}),
}


def write_child(root: Path, sid: str, body: bytes, compression: str, created_at: int, *, torn: bool = False) -> None:
    session_header = header(sid, created_at, origin="subagent", parent_session="p", delegation_depth=1)
    head = encode_header(session_header)
    log = new_log_file(root, sid, compression)
    if compression == "none":
        log.write_bytes(head + body)
        return
    data = zstd_frame(head) + zstd_frame(body)
    if torn:  # a damaged frame after it: a bad checksum in a complete frame is corruption
        bad = bytearray(zstd_frame(b'{"seq":99}\n'))
        bad[-1] ^= 0xFF
        data += bytes(bad) + zstd_frame(b"\n")
    log.write_bytes(data)


def build(root: Path, hostile: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """The parent `p`, three healthy children and the hostile ones: (healthy ids, hostile ids)."""
    session_header = header("p", T)
    new_log_file(root, "p", "none").write_bytes(encode_header(session_header) + json_line(0, "turn/start", {"turn": 1}))
    healthy = []
    for i, compression in enumerate(("none", "zstd", "none")):
        sid = f"ok-{i}"
        write_child(root, sid, _own(sid), compression, T + 1 + i)
        healthy.append(sid)
    bad = []
    for i, (name, compression) in enumerate(hostile):
        sid = f"bad-{i}"
        write_child(root, sid, _own(sid) + HOSTILE[name], compression, T + 100 + i, torn=(i % 2 == 1))
        bad.append(sid)
    return healthy, bad


async def check_entry_points(root: Path, healthy: list[str], bad: list[str]) -> None:
    async with open_runtime(root, now_ms=now_ms) as runtime:
        for _ in range(2):  # cold, then with whatever the index learned
            rows = {r.to_json()["id"]: r.to_json() for r in await runtime.listing.list_children("p")}
            for sid in healthy:
                assert rows[sid]["kind"] == "child" and rows[sid]["label"] == sid, rows[sid]
            for sid in bad:
                assert rows[sid] == {"kind": "diagnostic", "id": sid, "reason": "corrupt"}
            records = {r.id: r for r in await runtime.query.list_sessions()}
            assert {sid: records[sid].damage for sid in healthy + bad} == {
                **{sid: None for sid in healthy},
                **{sid: "corrupt" for sid in bad},
            }
            for sid in healthy:
                async with runtime.query.observe_session(sid) as observation:
                    assert observation.events
            for sid in bad:
                with pytest.raises(SessionQueryError) as info:
                    async with runtime.query.observe_session(sid):
                        pass
                assert info.value.code == "QUERY_CORRUPT_SESSION"


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("name", list(HOSTILE))
async def test_a_hostile_child_lists_as_corrupt_and_its_siblings_as_they_are(
    tmp_path: Path, name: str, compression: str
) -> None:
    healthy, bad = build(tmp_path, [(name, compression)])
    await check_entry_points(tmp_path, healthy, bad)


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    hostile=st.lists(
        st.tuples(st.sampled_from(sorted(HOSTILE)), st.sampled_from(["none", "zstd"])), min_size=1, max_size=3
    ),
    garbles=st.lists(st.tuples(st.integers(0, 1 << 16), st.binary(min_size=1, max_size=16)), min_size=1, max_size=8),
)
def test_fuzz_listing_over_a_garbled_index_and_hostile_children(
    tmp_path_factory: pytest.TempPathFactory, hostile: list[tuple[str, str]], garbles: list[tuple[int, bytes]]
) -> None:
    root = tmp_path_factory.mktemp("root")
    healthy, bad = build(root, hostile)
    trio.run(check_entry_points, root, healthy, bad)  # the index now holds rows and checkpoints
    garble(root / "index.sqlite3", garbles)  # (closed stores leave no -wal to garble)
    trio.run(check_entry_points, root, healthy, bad)
