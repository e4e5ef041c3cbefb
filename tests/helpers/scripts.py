"""Scripts several test files run (docs/scripts.md): kept once so their expectations agree."""

from __future__ import annotations

from typing import Any

# A parent that starts a background child ("helper"), waits for its settlement, lists its agents
# and answers NOTED; every reply reports usage (parent 60/6 over three calls, child 5/4).
BACKGROUND_CHILD: dict[str, Any] = {
    "agents": [
        {
            "responses": [
                {
                    "tool_calls": [
                        {"name": "subagent", "arguments": {"description": "helper", "prompt": "do the thing"}}
                    ],
                    "usage": {"input_tokens": 10, "output_tokens": 1},
                },
                {
                    "wait_for": {"settled": "helper"},
                    "text": "STARTED",
                    "tool_calls": [{"name": "list_agents", "arguments": {}}],
                    "usage": {"input_tokens": 20, "output_tokens": 2},
                },
                {"text": "NOTED", "usage": {"input_tokens": 30, "output_tokens": 3}},
            ]
        },
        {"label": "helper", "responses": [{"text": "CHILD_OK", "usage": {"input_tokens": 5, "output_tokens": 4}}]},
    ]
}
