"""The event vocabulary of format 1 (SPEC 3.2's table), written out independently of the code
so that tests compare the code against it."""

from __future__ import annotations

VOCABULARY = frozenset(
    {
        "system/message",
        "user/message",
        "assistant/message",
        "tool/result",
        "turn/start",
        "turn/end",
        "turn/continue",
        "step/start",
        "step/end",
        "tool/call",
        "session/end-seed",
        "subagent/descriptor",
        "subagent/catalog",
        "subagent/settled",
        "session/model",
        "session/stopped",
        "compaction/start",
        "compaction/summary",
        "compaction/end",
    }
)
SURFACE = frozenset({"system/message", "user/message", "assistant/message", "tool/result"})
