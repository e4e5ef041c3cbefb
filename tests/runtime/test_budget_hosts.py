"""Cost and tree budgets through the CLI (issue 30 items 2-4), on the local fake Messages API
(tests/helpers/fake_anthropic.py): `show`, `sessions --json` and `--stream`'s result line price
the recorded usage (cache reads and writes included) at `[prices]`; a tree budget given with
`--budget-tokens` survives a SIGKILL: the resumed runtime seeds its totals from the logs and
refuses the call that would cross the root's limit before it is sent.

The subprocess tests wait for the process to end; their timeouts are only hang guards."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cli_process import CLI, clean_env, kill_when_held
from fake_anthropic import AnthropicServer, Block, Reply

pytestmark = pytest.mark.slow  # every test runs a host process

KEY = "sk-ant-fake-BUDGETS-41d0c7"
TIMEOUT = 60
MODEL = "claude-test"
PRICES = f"""
[prices."anthropic:{MODEL}"]
input = 3.0
output = 15.0
cache_read = 0.3
cache_write = 3.75
"""


def cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args, "--root", str(root)],
        cwd=root.parent,
        env=clean_env(ANTHROPIC_API_KEY=KEY),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def has_results(body: dict[str, Any]) -> bool:
    return any(b["type"] == "tool_result" for b in body["messages"][-1]["content"])


def test_show_sessions_and_the_result_line_price_the_usage(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (tmp_path / "subagents.toml").write_text(PRICES)
    helper = {"description": "Greet", "prompt": "Say HI", "run_in_background": False}
    replies = [
        Reply.tool_uses(Block.tool_use("subagent", helper, id="toolu_a"), usage=(12, 40, 0, 900), when="Delegate"),
        Reply.text("HI", usage=(20, 2, 0, 0), when="Say HI"),
        Reply.text("It said HI", usage=(30, 6, 900, 50), when=has_results),
    ]
    with AnthropicServer(replies) as server:
        done = cli(
            root,
            "run",
            "--session",
            "s1",
            "--model",
            f"anthropic:{MODEL}",
            "--base-url",
            server.base_url,
            "--stream",
            "Delegate a greeting.",
        )
        assert done.returncode == 0, (done.stdout, done.stderr, server.leftovers())
    result = json.loads(done.stdout.splitlines()[-1])
    # The run's tree: the parent's two calls and the child's one.
    assert result["usage"]["cost"] == pytest.approx((62 * 3 + 48 * 15 + 900 * 0.3 + 950 * 3.75) / 1e6)
    shown = cli(root, "show", "s1")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "   call: 12 in, 40 out tokens, cache 0 read, 900 written (1 model call), cost $0.0040" in lines
    assert "   call: 30 in, 6 out tokens, cache 900 read, 50 written (1 model call), cost $0.0006" in lines
    assert "── total usage: 42 in, 46 out tokens, cache 900 read, 950 written (2 model calls), cost $0.0046" in lines
    # The subtree's total last: the session and its one-shot child, as chat /usage sums them.
    assert lines[-1] == (
        "── with 1 subagent: 62 in, 48 out tokens, cache 900 read, 950 written (3 model calls), cost $0.0047"
    )
    as_json = json.loads(cli(root, "show", "s1", "--json").stdout)
    assert as_json[-2]["type"] == "usage"
    assert as_json[-2]["total"]["cost"] == pytest.approx(4648.5 / 1e6)
    tree = as_json[-1]
    assert (tree["type"], tree["sessions"], tree["skipped"]) == ("tree-usage", 2, [])
    assert (tree["total"]["input_tokens"], tree["total"]["output_tokens"], tree["total"]["calls"]) == (62, 48, 3)
    assert tree["total"]["cost"] == pytest.approx(result["usage"]["cost"])
    rows = {row["id"]: row for row in json.loads(cli(root, "sessions", "--json").stdout)}
    assert rows["s1"]["cost"] == pytest.approx(4648.5 / 1e6)
    assert rows["s1"]["tree_cost"] == pytest.approx(result["usage"]["cost"])
    (child,) = set(rows) - {"s1"}
    assert rows[child]["cost"] == pytest.approx((20 * 3 + 2 * 15) / 1e6)

    chat = subprocess.run(
        [*CLI, "chat", "--root", str(root), "--session", "s1", "--model", f"anthropic:{MODEL}"],
        cwd=tmp_path,
        env=clean_env(ANTHROPIC_API_KEY=KEY),
        input="/usage\n/quit\n",
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert chat.returncode == 0, chat.stderr
    assert "session s1: 42 in, 46 out tokens, cache 900 read, 950 written (2 model calls), cost $0.0046" in chat.stdout
    assert (
        "with 1 subagent: 62 in, 48 out tokens, cache 900 read, 950 written (3 model calls), cost $0.0047"
        in chat.stdout
    )

    # Without a price for the model: the same figures, `cost unknown`.
    (tmp_path / "subagents.toml").write_text('[prices."anthropic:another"]\ninput = 1\noutput = 1\n')
    unpriced = cli(root, "show", "s1")
    assert "── total usage: 42 in, 46 out tokens, cache 900 read, 950 written (2 model calls), cost unknown" in (
        unpriced.stdout.splitlines()
    )
    # Without a table: no cost at all, as before.
    (tmp_path / "subagents.toml").unlink()
    plain = cli(root, "show", "s1")
    assert (
        "── total usage: 42 in, 46 out tokens, cache 900 read, 950 written (2 model calls)" in plain.stdout.splitlines()
    )
    # A bad table: one line, and show still shows (without costs).
    (tmp_path / "subagents.toml").write_text('[prices."anthropic:x"]\ninput = -1\noutput = 1\n')
    damaged = cli(root, "show", "s1")
    assert damaged.returncode == 0
    assert damaged.stderr.strip().endswith(
        'prices."anthropic:x" input must be a number >= 0 (per million tokens), got -1'
    )
    assert len(damaged.stderr.strip().splitlines()) == 1
    refused = cli(root, "run", "--model", f"anthropic:{MODEL}", "hello")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert 'prices."anthropic:x" input must be a number >= 0' in refused.stderr


def test_a_tree_budget_survives_a_sigkill_and_is_checked_again_on_resume(tmp_path: Path) -> None:
    """`--budget-tokens 5000`: the parent starts a background child, which spends 4,000 and
    settles; the parent's call for its notice is killed in flight. The resumed runtime reads the
    spending back from both logs: the lost call is issued again (900 more: 4,995 in all), and
    the next prompt's call is refused before it is sent — the child's 4,000 counted, though no
    process that saw them is alive."""
    root = tmp_path / "root"
    worker = {"description": "Worker", "prompt": "work hard", "run_in_background": True}
    replies = [
        Reply.tool_uses(Block.tool_use("subagent", worker, id="toolu_w"), usage=(50, 10, 0, 0), when="Delegate"),
        Reply.text("started it", usage=(30, 5, 0, 0), when=has_results),
        Reply.text("done", usage=(4000, 0, 0, 0), when="work hard"),
        Reply.text("noted ", "it", hold_after=2, when="closing message"),
        Reply.text("noted it", usage=(900, 0, 0, 0), when="closing message"),  # the lost call, again
    ]
    spec = f"anthropic:{MODEL}"
    command = [*CLI, "run", "--root", str(root), "--session", "s1", "--model", spec, "--budget-tokens", "5000"]
    with AnthropicServer(replies) as server:
        kill_when_held(
            [*command, "--base-url", server.base_url, "Delegate the work."],
            server.holding,
            cwd=tmp_path,
            env=clean_env(ANTHROPIC_API_KEY=KEY),
            timeout=TIMEOUT,
        )
        done = subprocess.run(
            [*command, "--base-url", server.base_url, "--stream", "again"],
            cwd=tmp_path,
            env=clean_env(ANTHROPIC_API_KEY=KEY),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert server.leftovers() == {}, server.leftovers()  # the last call never reached it
    assert done.returncode == 1, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    ends = [e["data"]["reason"] for e in events if e["session_id"] == "s1" and e["type"] == "turn/end"]
    assert ends[-2] == {"kind": "completed"}  # the continued turn
    assert ends[-1]["kind"] == "budget"
    assert ends[-1]["message"].startswith("max_tokens 5000 would be crossed: 4995 used, this call ~"), ends
    assert "the turn ended budget: max_tokens 5000 would be crossed: 4995 used" in done.stderr
