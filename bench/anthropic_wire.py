"""Micro-figures of the Anthropic wire module (issue 30): building a long request body and reading
a long stream, beside the OpenAI mapping. Run: .venv/bin/python bench/anthropic_wire.py"""

import json
import sys
import time

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "tests" / "helpers"))
from fake_anthropic import Block, Reply
from subagents.runtime.models.anthropic_wire import AnthropicOptions, StreamParser, anthropic_body
from subagents.runtime.models.base import ModelRequest, ToolSpec
from subagents.runtime.models.openai_wire import openai_messages


def msg(role, blocks, kind="user"):
    return {"id": "m", "role": role, "content": blocks, "source": {"kind": kind}}


hist = [msg("system", [{"type": "text", "text": "sys " * 200}])]
for i in range(100):
    hist.append(msg("user", [{"type": "text", "text": f"question {i} " * 20}]))
    hist.append(
        msg(
            "assistant",
            [
                {"type": "thinking", "thinking": "t" * 300, "signature": "s" * 200},
                {"type": "text", "text": "a " * 50},
                {"type": "tool-call", "id": f"c{i}", "name": "echo", "arguments": json.dumps({"text": "x" * 100})},
            ],
            "model",
        )
    )
    hist.append(
        {
            "id": "r",
            "role": "user",
            "content": [
                {
                    "type": "tool-result",
                    "call_id": f"c{i}",
                    "content": [{"type": "text", "text": "r" * 200}],
                    "is_error": False,
                }
            ],
            "source": {"kind": "tool", "call_id": f"c{i}"},
        }
    )
req = ModelRequest(
    messages=hist, tools=[ToolSpec(name=f"t{i}", description="d", parameters={"type": "object"}) for i in range(12)]
)
opts = AnthropicOptions(thinking_budget=2048)
n = 200
t = time.perf_counter()
for _ in range(n):
    anthropic_body("m", req, opts)
a = (time.perf_counter() - t) / n
t = time.perf_counter()
for _ in range(n):
    openai_messages(hist)
o = (time.perf_counter() - t) / n
print(f"body for 301 messages + 12 tools: anthropic {a * 1e3:.2f} ms, openai messages {o * 1e3:.2f} ms")
reply = Reply(
    blocks=tuple([Block.text(*(["word "] * 2000)), Block.tool_use("echo", {"text": "y" * 5000}, fragments=200)]),
    stop_reason="tool_use",
)
data = b"".join(f"event: {nm}\ndata: {json.dumps(d)}\n\n".encode() for nm, d in reply.events("m"))
t = time.perf_counter()
for _ in range(50):
    p = StreamParser()
    for i in range(0, len(data), 4096):
        p.feed(data[i : i + 4096])
    p.end()
dt = (time.perf_counter() - t) / 50
print(f"stream parse: {len(data) / 1e6:.2f} MB, {2200} events in {dt * 1e3:.1f} ms = {len(data) / dt / 1e6:.1f} MB/s")
