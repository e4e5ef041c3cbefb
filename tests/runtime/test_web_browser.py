"""The web console in a real browser (issue 31, "Tests"): Debian's `chromium` headless through
Playwright (`executable_path`: Playwright's own browser download cannot run here) against a
real server on a loopback port, over a store a real host runs: a runtime with the scripted model
in another process, whose lead started a background worker.

The story: the overview follows the worker's progress without a reload; the tree shows it
running; its session page shows what it did and, live, what it does next; a message sent from
the page (holding `<script>`, shown as text, never run) is answered by the worker's host and the
answer appears on the page; the worker stopped from the page ends its turn, and its lead hears
of it. Screenshots of the overview, the tree with the running worker and the worker's page go
to `$SUBAGENTS_SHOW_DIR` (as `web-*.png`) when it is set, else to the test's temporary folder.

The host waits on its stdin (the worker's `work` tool reads a line): the test releases it
there, so every step waits on something that happened, never on time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from web_console import TOKEN, garble_tail, served

CHROMIUM = "/usr/bin/chromium"
HANG = 30_000  # ms a browser wait may take: only a hang reaches it
QUESTION = 'what is six times seven? <script>alert("pwned")</script>'

SCRIPT = {
    "agents": [
        {
            "session": "lead",
            "responses": [
                {
                    "tool_calls": [
                        {
                            "name": "subagent",
                            "arguments": {
                                "description": "Worker <i>one</i>",
                                "prompt": "work, then wait",
                                "run_in_background": True,
                            },
                        }
                    ]
                },
                {"text": "started the worker", "usage": {"input_tokens": 1400, "output_tokens": 12}},
                {"text": "noted: the worker stopped", "usage": {"input_tokens": 1500, "output_tokens": 9}},
            ],
        },
        {
            "label": "Worker <i>one</i>",
            "responses": [
                {
                    "tool_calls": [{"name": "work", "arguments": {"step": 1}}],
                    "usage": {"input_tokens": 900, "output_tokens": 20},
                },
                {
                    "wait_for": {"steered": True},
                    "text": "step 1 is done; waiting for word",
                    "usage": {"input_tokens": 950, "output_tokens": 11},
                },
                {
                    "text": "you asked {{from_request:(six times seven)}}: it is 42",
                    "tool_calls": [{"name": "work", "arguments": {"step": 2}}],
                    "usage": {"input_tokens": 1010, "output_tokens": 30},
                },
                {"hang": True},
            ],
        },
    ]
}

# The host: a runtime on the store, the lead's first turn starting the worker, until its tree
# is idle. `work` prints `WORKING <session> <step>` and answers with the next line of stdin.
HOST = """
import json, sys, trio
from subagents.runtime.app import open_runtime
from subagents.runtime.testing.script_format import load_script
from subagents.runtime.testing.scripted_model import ScriptedModel
from subagents.runtime.tools.base import FunctionTool

async def work(args, ctx):
    print("WORKING", ctx.session_id, args.get("step"), flush=True)
    line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
    return "step %s done (%s)" % (args.get("step"), line.strip())

async def main(root, script):
    tool = FunctionTool(name="work", description="Does one step of work.", fn=work)
    model = ScriptedModel(load_script(script), stall_timeout=None)
    async with open_runtime(root, model=model, compression="none", tools=lambda: [tool]) as rt:
        lead = await rt.agents.create(session_id="lead")
        await lead.send("start the worker")
        await rt.subagents.wait_tree_idle(lead)
        print("IDLE", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)  # lets its sessions go when told

trio.run(main, sys.argv[1], sys.argv[2])
"""


def _show_dir(tmp_path: Path) -> Path:
    folder = os.environ.get("SUBAGENTS_SHOW_DIR")
    return Path(folder) if folder else tmp_path


@pytest.mark.slow  # a real browser (Debian's chromium, headless, through Playwright) and a host process
async def test_a_real_browser_follows_a_running_worker_talks_to_it_and_stops_it(tmp_path: Path) -> None:
    assert Path(CHROMIUM).exists(), "chromium is missing: .ci/run installs it (apt-get install chromium)"
    root = tmp_path / "store"
    root.mkdir()
    shots = _show_dir(tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    host = _start_host(root)
    try:
        assert host.stdout is not None and host.stdin is not None
        worker = (await trio.to_thread.run_sync(_expect, host, "WORKING")).split()[
            1
        ]  # its first step runs until the test says
        async with served(root, live_interval=0.2) as url:
            seen = await trio.to_thread.run_sync(_browse, url, root, host, worker, shots)
        assert await trio.to_thread.run_sync(host.wait) == 0
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
    assert seen["dialogs"] == []  # the message's script never ran
    assert [m for m in seen["console"] if "Content Security Policy" in m] == []
    # The overview fetched itself again, without a reload: the worker's event count grew.
    assert seen["overview_followed"] and int(seen["events_after"]) > int(seen["events_before"])
    assert "Worker <i>one</i>" in seen["tree"] and "running" in seen["tree"]  # the label as text
    assert seen["done"] == "  ← step 1 done (go on)"
    assert (
        seen["sent"].startswith("send ") and f"delivered to session {worker} (live in another process" in seen["sent"]
    )
    assert seen["question"] == f"user: {QUESTION}"  # as text
    assert seen["answer"] == "assistant: you asked six times seven: it is 42"
    assert seen["stopped"].startswith("stop ") and f"delivered to session {worker}" in seen["stopped"]
    assert seen["ended"].startswith("── end of turn 1: aborted user")
    assert seen["idle"] == "IDLE"
    assert "live elsewhere" in seen["roots_before"] and "persisted" in seen["roots_after"]
    assert seen["damaged"].startswith(f"the log is damaged: session '{worker}' is corrupt at seq ")
    assert seen["damaged_status"].startswith("the live feed stopped: the log is damaged")
    assert seen["banner"].startswith("The store does not answer (")
    assert seen["session_banner"].startswith("The store does not answer (")
    assert (seen["unavailable"], seen["banner_after"]) == ("Store unavailable", False)
    for name in ("overview", "tree", "session"):
        assert (shots / f"web-{name}.png").stat().st_size > 0


def _start_host(root: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", HOST, str(root), json.dumps(SCRIPT)]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _expect(process: subprocess.Popen[str], word: str) -> str:
    """The host's next stdout line starting with `word` (its other lines are skipped)."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(word):
            return line.strip()
    raise AssertionError(f"the host ended before saying {word}")


def release(host: subprocess.Popen[str], line: str) -> None:
    """Let the worker's `work` step end (the host reads a line of its stdin)."""
    assert host.stdin is not None
    host.stdin.write(line + "\n")
    host.stdin.flush()


def _browse(url: str, root: Path, host: subprocess.Popen[str], worker: str, shots: Path) -> dict[str, Any]:
    from playwright.sync_api import expect, sync_playwright

    seen: dict[str, Any] = {"dialogs": [], "console": []}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(HANG)
            page.on("dialog", lambda d: (seen["dialogs"].append(d.message), d.dismiss()))
            page.on("console", lambda m: seen["console"].append(m.text))
            # Sign in: the session page's controls need it.
            page.goto(url + "/login")
            page.fill("input[name=token]", TOKEN)
            page.click("button[type=submit]")
            # The tree, open while the worker's first step ends: its feed says so, and the page
            # fetches its rows again: the worker, running (its model call waits for word).
            page.goto(url + "/tree/lead")
            page.wait_for_selector("#live-status:has-text('following the tree')")
            release(host, "go on")
            page.wait_for_selector(f"#live-status:has-text('{worker} #')")
            page.wait_for_selector("#tree-live td:has-text('running')")
            seen["tree"] = page.inner_text("#tree-live")
            page.screenshot(path=str(shots / "web-tree.png"), full_page=True)
            # The worker's page: its first step's result, then a message, and the answer, live.
            page.click(f"#tree-live a:text-is('{worker}')")
            page.wait_for_selector("#live-status:has-text('following new events')")
            seen["done"] = page.inner_text("li[data-type='tool/result'] pre")
            page.fill("input[name=text]", QUESTION)
            page.click("button:has-text('Send')")
            seen["sent"] = page.inner_text("p.outcome")
            page.click("text=Back to session")
            page.wait_for_selector("#live-status:has-text('following new events')")
            question = page.wait_for_selector("li[data-type='user/message'] pre:has-text('six times seven')")
            seen["question"] = question.inner_text() if question else ""
            answer = page.wait_for_selector("li[data-type='assistant/message'] pre:has-text('it is 42')")
            seen["answer"] = answer.inner_text() if answer else ""
            # The overview, open while the worker's second step ends: it fetches itself again.
            page.goto(url + "/")
            page.wait_for_selector("text=2 sessions, 1 roots.")
            page.wait_for_selector("body[data-store='up']")  # following the pulse
            events = page.locator(f"table.sessions tr:has(a:text-is('{worker}')) td").nth(4)
            seen["events_before"] = events.inner_text()
            release(host, "and rest")
            expect(events).not_to_have_text(seen["events_before"], timeout=HANG)  # its row, again
            seen["events_after"] = events.inner_text()
            seen["overview_followed"] = page.get_attribute("main", "data-generation")
            page.screenshot(path=str(shots / "web-overview.png"), full_page=True)
            page.goto(url + f"/session/{worker}")
            page.wait_for_selector("li[data-type='tool/result'] pre:has-text('step 2 done')")
            page.screenshot(path=str(shots / "web-session.png"), full_page=True)
            # Stop it: its turn ends aborted, on the same page.
            page.click("button:text-is('Stop')")
            seen["stopped"] = page.inner_text("p.outcome")
            page.click("text=Back to session")
            ended = page.wait_for_selector("li[data-type='turn/end'] pre")
            seen["ended"] = ended.inner_text() if ended else ""
            # The roots page, open while the host lets its sessions go: the lead's row follows.
            page.goto(url + "/tree")
            page.wait_for_selector("body[data-store='up']")
            seen["idle"] = _expect(host, "IDLE")  # the lead heard of the stop: its tree is idle
            seen["roots_before"] = page.inner_text("main table")
            release(host, "bye")
            page.wait_for_selector("main table td:text-is('persisted')")
            seen["roots_after"] = page.inner_text("main table")
            # The worker's page while its log is damaged under it: said where its events stop.
            page.goto(url + f"/session/{worker}")
            page.wait_for_selector("#live-status:has-text('following new events')")
            garble_tail(root, worker, 99)
            seen["damaged"] = page.inner_text("li.diagnostic[data-type='damaged'] pre")
            seen["damaged_status"] = page.inner_text("#live-status")
            # A page with its own feed asks /live/state now and then (it holds no /live stream):
            # the store moved away under it is a banner too, gone once the store is back.
            page.wait_for_selector("body[data-store='up']")
            root.rename(root.with_name("away"))
            seen["session_banner"] = page.wait_for_selector("#store-banner", state="visible").inner_text()
            root.with_name("away").rename(root)
            page.wait_for_selector("#store-banner", state="hidden")
            # The store moved away under an open page: a banner; a page loaded meanwhile is
            # "Store unavailable", and loads itself again once the store is back.
            page.goto(url + "/")
            page.wait_for_selector("body[data-store='up']")
            away = root.with_name("away")
            root.rename(away)
            seen["banner"] = page.wait_for_selector("#store-banner", state="visible").inner_text()
            page.goto(url + "/")
            seen["unavailable"] = page.inner_text("h1")
            page.wait_for_selector("body[data-store='down']")
            away.rename(root)
            page.wait_for_selector("h1:text-is('Overview')")  # it loaded itself again
            page.wait_for_selector("body[data-store='up']")
            seen["banner_after"] = page.is_visible("#store-banner")
        finally:
            browser.close()
    return seen
