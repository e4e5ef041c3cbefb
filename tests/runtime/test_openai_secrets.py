"""The API key never leaks (issue 13 item 2c, SPEC 5.2): not whole, not as any run of 8 or more of
its characters, in any error text, repr, log record, stderr, `show` output or file under the root
— wherever a provider quotes it, and at whatever offset around an excerpt's cut it sits.

Provider answers come from `httpx.MockTransport` in-process (the full `OpenAIChatModel`), then
through the agent loop into a `FileLogStore` (zstd) and `subagents show`; one CLI `run` talks to a
small HTTP server on 127.0.0.1. Backoff sleeps on a `ScenarioClock`, never for real.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import aclosing
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import zstandard
from cli_process import CLI, clean_env
from http_request import read_request
from subagents.runtime.app import open_runtime
from subagents.runtime.foundation.clock import ScenarioClock
from subagents.runtime.foundation.errors import ModelError
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.hosts.cli import entry as cli
from subagents.runtime.models.base import ModelRequest
from subagents.runtime.models.openai import OpenAIChatModel, redact_secret

KEY = "sk-LEAK-Q7f3a9c1e5b2d4f60Zx8W9v"
GRAMS = {KEY[i : i + 8] for i in range(len(KEY) - 7)}
CUT = 200  # the excerpt length of provider text in an error message
SSE_CUT = 120  # the excerpt length of a line that is not an event stream
# Whole, a prefix, a long prefix, the tail, a middle run: what a provider may echo.
PIECES = {"whole": KEY, "prefix8": KEY[:8], "prefix20": KEY[:20], "tail8": KEY[-8:], "middle": KEY[5:25]}
GUARD = 60.0  # real seconds: only reached if a subprocess hangs


def leaks(text: str | bytes) -> list[str]:
    """The 8-character runs of the key found in `text` (empty: clean)."""
    if isinstance(text, bytes):
        return [g for g in GRAMS if g.encode() in text]
    return [g for g in GRAMS if g in text]


def placed(piece: str, offset: int, cut: int = CUT) -> str:
    """`piece` at `offset` in provider text that runs well past the cut, no blanks (so the
    one-line excerpt keeps every offset as it is)."""
    return "p" * offset + piece + "q" * (cut + 40)


def offsets(piece: str, cut: int = CUT) -> range:
    """Every offset from wholly before the cut, across it, to wholly after it."""
    return range(max(0, cut - len(piece) - 3), cut + 3)


def cases(cut: int = CUT) -> Iterator[tuple[str, int, str]]:
    for name, piece in PIECES.items():
        for offset in offsets(piece, cut):
            yield name, offset, placed(piece, offset, cut)


# --- redact_secret ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ""),
        ("nothing here", "nothing here"),
        (f"bad key {KEY}.", "bad key [redacted]."),
        (f"{KEY}{KEY}", "[redacted]"),
        (f"{KEY} and {KEY}", "[redacted] and [redacted]"),
        (f"prefix {KEY[:8]} only", "prefix [redacted] only"),
        (f"too short {KEY[:7]} kept", f"too short {KEY[:7]} kept"),
        (f"masked {KEY[:10]}****{KEY[-8:]}", "masked [redacted]****[redacted]"),
        (f"x{KEY[3:]}", "x[redacted]"),
    ],
)
def test_redact_secret(text: str, expected: str) -> None:
    assert redact_secret(text, KEY) == expected


def test_redact_secret_without_a_key_or_with_a_short_one() -> None:
    assert redact_secret(f"a {KEY}", None) == f"a {KEY}"
    assert redact_secret(f"a {KEY}", "") == f"a {KEY}"
    assert redact_secret("k3y and k3 and k3y", "k3y") == "[redacted] and k3 and [redacted]"


@pytest.mark.slow  # the key at every offset: many runs
@pytest.mark.parametrize("name", sorted(PIECES))
def test_redacting_then_cutting_leaves_no_run_at_any_offset(name: str) -> None:
    piece = PIECES[name]
    for offset in range(0, 3 * len(KEY) + 10):
        text = redact_secret(placed(piece, offset), KEY)
        for cut in range(len(text) + 1):
            assert not leaks(text[:cut]), (offset, cut)


# --- the model: every error path, every offset --------------------------------------------------


def request() -> ModelRequest:
    return ModelRequest(
        messages=[
            {"id": "u1", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "prompt"}}
        ]
    )


Handler = Callable[[httpx.Request], httpx.Response]


def model_with(handler: Handler, **options: Any) -> OpenAIChatModel:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    options.setdefault("clock", ScenarioClock())  # backoff never sleeps for real
    return OpenAIChatModel(
        "m",
        base_url="http://provider.test/v1",
        api_key=KEY,
        client=client,
        max_retries=options.pop("max_retries", 1),
        **options,
    )


async def failure(model: OpenAIChatModel) -> ModelError:
    with pytest.raises(ModelError) as info:
        async with aclosing(model.stream(request())) as stream:
            async for _ in stream:
                pass
    return info.value


def assert_clean_error(error: ModelError, where: Any) -> None:
    for text in (str(error), repr(error), error.message, repr(error.args)):
        assert not leaks(text), (where, text)
    # No chained exception: an httpx error would hold the request, and so its headers.
    assert error.__cause__ is None and error.__context__ is None, where


STATUSES = [401, 403, 404, 429, 500, 400]


@pytest.mark.slow  # the key at every offset of every error body: many runs
@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("form", ["json", "plain"])
async def test_error_bodies_never_leak_at_any_offset(status: int, form: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    seen_redacted = 0
    for name, offset, text in cases():
        body = json.dumps({"error": {"message": text}}) if form == "json" else text
        headers = {"content-type": "application/json" if form == "json" else "text/plain"}
        model = model_with(lambda r, body=body: httpx.Response(status, headers=headers, text=body))
        error = await failure(model)
        assert error.status == (status if status not in (429, 500) else None)
        assert_clean_error(error, (name, offset))
        if offset + len("[redacted]") < CUT:  # positive control: the marker fits in the excerpt
            assert "[redacted]" in error.message, (name, offset, error.message)
            seen_redacted += 1
    assert seen_redacted > 0
    assert not leaks(caplog.text)
    for record in caplog.records:
        assert not leaks(record.getMessage()) and not leaks(repr(record.args))


@pytest.mark.slow  # the key at every offset of every stream error: many runs
@pytest.mark.parametrize("kind", ["event-error", "data-error", "not-json", "not-an-object"])
async def test_stream_errors_never_leak_at_any_offset(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for name, offset, text in cases():
        if kind == "event-error":
            stream = f"event: error\ndata: {text}\n\n"
        elif kind == "data-error":
            stream = f"data: {json.dumps({'error': {'message': text}})}\n\n"
        elif kind == "not-json":
            stream = f"data: {text}\n\n"
        else:
            stream = f"data: {json.dumps([text])}\n\n"
        model = model_with(
            lambda r, s=stream: httpx.Response(200, headers={"content-type": "text/event-stream"}, text=s)
        )
        error = await failure(model)
        assert error.code == "MODEL_BAD_STREAM", error
        assert_clean_error(error, (name, offset))
    assert not leaks(caplog.text)


async def test_bodies_that_are_not_event_streams_never_leak(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for name, offset, text in cases(SSE_CUT):
        line = "<" + text  # not a field name: the body is not an event stream
        model = model_with(lambda r, s=line: httpx.Response(200, headers={"content-type": "text/event-stream"}, text=s))
        error = await failure(model)
        assert error.code == "MODEL_BAD_RESPONSE", error
        assert_clean_error(error, (name, offset))
    for name, offset, text in cases():
        model = model_with(lambda r, s=text: httpx.Response(200, headers={"content-type": "application/json"}, text=s))
        error = await failure(model)
        assert error.code == "MODEL_BAD_RESPONSE", error
        assert_clean_error(error, (name, offset))
    assert not leaks(caplog.text)


async def test_transport_errors_never_leak(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for name, offset, text in cases():

        def refuse(r: httpx.Request, text: str = text) -> httpx.Response:
            raise httpx.ConnectError(text, request=r)

        def broken(r: httpx.Request, text: str = text) -> httpx.Response:
            raise httpx.UnsupportedProtocol(text, request=r)

        async def cut_body(text: str = text) -> AsyncIterator[bytes]:
            yield b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'
            raise httpx.ReadError(text)

        def cut(r: httpx.Request, body: Any = cut_body) -> httpx.Response:
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

        for handler, code in (
            (refuse, "MODEL_UNAVAILABLE"),
            (broken, "MODEL_HTTP_ERROR"),
            (cut, "MODEL_STREAM_INTERRUPTED"),
        ):
            error = await failure(model_with(handler))
            assert error.code == code, error
            assert_clean_error(error, (name, offset, code))
    assert not leaks(caplog.text)
    assert any("POST" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records)  # retry logging ran


# --- through the agent loop: the log, the index, `show` -------------------------------------------


def plain_files(root: Path) -> list[tuple[Path, bytes]]:
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            found.append((path, data))
            if path.name.endswith(".zst"):
                with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True) as reader:
                    found.append((path, reader.read()))
    return found


FULL_STACK = [
    (status, name, offset)
    for status in (401, 403, 429, 500)
    for name in ("whole", "prefix20")
    for offset in (CUT - len(PIECES[name]) + 1, CUT - 8, CUT - 1, 10)
]


@pytest.mark.slow  # the whole stack into a store, then `show` twice
def test_the_key_never_reaches_the_log_the_index_or_show(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    root = tmp_path / "root"
    bodies = {f"s{i}": (status, placed(PIECES[name], offset)) for i, (status, name, offset) in enumerate(FULL_STACK)}

    async def main() -> dict[str, Any]:
        reasons = {}
        for sid, (status, text) in bodies.items():
            model = model_with(lambda r, s=status, t=text: httpx.Response(s, json={"error": {"message": t}}))
            async with open_runtime(
                root, model=model, clock=ScenarioClock(), id_factory=CountingIds("x"), compression="zstd"
            ) as rt:
                agent = await rt.agents.create(session_id=sid)
                await agent.send("hello there")
                result = await rt.subagents.wait_tree_idle(agent)
                assert result is not None
                reasons[sid] = result.reason
        return reasons

    reasons = trio.run(main)
    for (_status, _name, offset), (_sid, reason) in zip(FULL_STACK, reasons.items()):
        assert reason["kind"] == "error", reason
        if offset + len("[redacted]") < CUT:  # positive control: the marker fits in the excerpt
            assert "[redacted]" in reason["message"], reason
        assert not leaks(json.dumps(reason))
    capsys.readouterr()
    for sid in bodies:
        assert cli.main(["show", "--root", str(root), sid]) == 0
        assert cli.main(["show", "--root", str(root), "--json", sid]) == 0
    shown = capsys.readouterr()
    assert "[redacted]" in shown.out  # positive control: show printed the errors
    assert not leaks(shown.out) and not leaks(shown.err)
    files = plain_files(root)
    assert any(b"hello there" in data for _, data in files)  # positive control: the scan reads the logs
    assert any(path.name == "index.sqlite3" for path, _ in files)
    for path, data in files:
        assert not leaks(data), path
    assert not leaks(caplog.text)


# --- the CLI: `run` against a provider that echoes the key --------------------------------------


async def echoing_server(stream: trio.SocketStream, *, status: int, body: bytes) -> None:
    try:
        if await read_request(stream) is None:
            return
        head = (
            f"HTTP/1.1 {status} Oops\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        await stream.send_all(head.encode() + body)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client hung up first (it had what it needed): the test judges its output
    finally:
        await stream.aclose()


@pytest.mark.slow  # a real `subagents run` process per status
@pytest.mark.parametrize("status", [401, 403])
async def test_cli_run_never_prints_or_stores_the_key(nursery: trio.Nursery, tmp_path: Path, status: int) -> None:
    body = json.dumps({"error": {"message": placed(KEY, CUT - 20)}}).encode()  # across the cut
    listeners = await nursery.start(
        partial(trio.serve_tcp, partial(echoing_server, status=status, body=body), 0, host="127.0.0.1")
    )
    port = listeners[0].socket.getsockname()[1]
    root = tmp_path / "root"
    env = clean_env(OPENAI_API_KEY=KEY)
    with trio.fail_after(GUARD):
        done = await trio.run_process(
            [
                *CLI,
                "run",
                "--root",
                str(root),
                "--session",
                "s1",
                "--model",
                "openai:m",
                "--base-url",
                f"http://127.0.0.1:{port}/v1",
                "go",
            ],
            cwd=tmp_path,
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        shown = await trio.run_process(
            [*CLI, "show", "--root", str(root), "s1"],
            cwd=tmp_path,
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 1, done.stderr
    assert b"authentication failed" in done.stderr and b"[redacted]" in done.stderr
    assert shown.returncode == 0 and b"[redacted]" in shown.stdout
    for output in (done.stdout, done.stderr, shown.stdout, shown.stderr):
        assert not leaks(output), output
    for path, data in plain_files(root):
        assert not leaks(data), path
