"""The chat's one reader: the prompt and permission questions never read at once, a question
interrupts an idle prompt and the prompt comes back, a pipe's next line answers, and a question
whose call was cancelled is not asked."""

from __future__ import annotations

import trio
import trio.testing
from subagents.runtime.hosts.chat.input import QUESTION, Asker, parse_answer
from subagents.runtime.hosts.chat.terminal import INTERRUPTED
from subagents.runtime.tools.permissions import PermissionAnswer, PermissionRequest


def request(tool: str = "write_file") -> PermissionRequest:
    return PermissionRequest(session_id="s", call_id="c", tool=tool, arguments={}, title=f"{tool}({{}})")


class FakeLines:
    """Lines the test hands over one at a time; `interrupt` ends the read in progress (a terminal)
    or does nothing (a pipe)."""

    def __init__(self, interruptible: bool) -> None:
        self.interruptible = interruptible
        self.prompts: list[str] = []
        self.reading = 0
        self.most_at_once = 0
        self.send, self.receive = trio.open_memory_channel[object](10)
        self._interrupt: trio.Event | None = None

    async def read(self, prompt: str) -> object:
        self.prompts.append(prompt)
        self.reading += 1
        self.most_at_once = max(self.most_at_once, self.reading)
        self._interrupt = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                got: list[object] = []

                async def line() -> None:
                    got.append(await self.receive.receive())
                    nursery.cancel_scope.cancel()

                async def interrupted() -> None:
                    assert self._interrupt is not None
                    await self._interrupt.wait()
                    got.append(INTERRUPTED)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(line)
                nursery.start_soon(interrupted)
            return got[0]
        finally:
            self.reading -= 1

    def interrupt(self) -> None:
        if self.interruptible and self._interrupt is not None:
            self._interrupt.set()


def test_answers() -> None:
    assert parse_answer("y") == PermissionAnswer("allow")
    assert parse_answer(" Yes ") == PermissionAnswer("allow")
    assert parse_answer("a") == PermissionAnswer("always")
    for line in ("", "n", "nope", None, object()):
        assert parse_answer(line).outcome == "deny"


async def test_a_question_interrupts_the_idle_prompt_which_comes_back() -> None:
    lines = FakeLines(interruptible=True)
    said: list[str] = []
    asker = Asker(lines, said.append, "root")
    async with trio.open_nursery() as nursery:
        typed: list[object] = []

        async def person() -> None:
            typed.append(await asker.prompt("> "))

        nursery.start_soon(person)
        await trio.testing.wait_all_tasks_blocked()
        answers: list[PermissionAnswer] = []

        async def ask() -> None:
            answers.append(await asker.approve(request()))

        nursery.start_soon(ask)
        await trio.testing.wait_all_tasks_blocked()
        assert lines.prompts == ["> ", QUESTION]  # the prompt stepped aside for the question
        await lines.send.send("y")
        await trio.testing.wait_all_tasks_blocked()
        assert answers == [PermissionAnswer("allow")]
        assert lines.prompts == ["> ", QUESTION, "> "]  # and came back
        await lines.send.send("hello")
    assert typed == ["hello"]
    assert said == ["permission (subagent s): write_file({})", "(allowed: write_file)"]
    assert lines.most_at_once == 1


async def test_on_a_pipe_the_pending_read_answers_the_question() -> None:
    lines = FakeLines(interruptible=False)
    asker = Asker(lines, lambda text: None)
    async with trio.open_nursery() as nursery:
        typed: list[object] = []
        answers: list[PermissionAnswer] = []

        async def person() -> None:
            typed.append(await asker.prompt("> "))

        async def ask() -> None:
            answers.append(await asker.approve(request("run_command")))

        nursery.start_soon(person)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(ask)
        await trio.testing.wait_all_tasks_blocked()
        await lines.send.send("no")  # read by the prompt's pending read: it answers the question
        await trio.testing.wait_all_tasks_blocked()
        assert answers == [PermissionAnswer("deny", "the person declined the permission request")]
        await lines.send.send("next line")
    assert typed == ["next line"]
    assert lines.most_at_once == 1


async def test_questions_during_a_turn_are_asked_one_at_a_time_and_a_cancelled_one_is_dropped() -> None:
    lines = FakeLines(interruptible=True)
    asker = Asker(lines, lambda text: None)
    answers: dict[str, PermissionAnswer] = {}
    # A hang guard only: were the cancelled question still asked, "fourth" would wait forever.
    with trio.fail_after(10):
        await _ask_four(lines, asker, answers)
    assert answers == {
        "first": PermissionAnswer("always"),
        "second": PermissionAnswer("allow"),
        "fourth": PermissionAnswer("deny", "the person declined the permission request"),
    }
    assert lines.prompts == [QUESTION, QUESTION, QUESTION]
    assert lines.most_at_once == 1


async def _ask_four(lines: FakeLines, asker: Asker, answers: dict[str, PermissionAnswer]) -> None:
    async with trio.open_nursery() as nursery:

        async def ask(tool: str) -> None:
            answers[tool] = await asker.approve(request(tool))

        nursery.start_soon(ask, "first")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(ask, "second")  # queued behind the first
        await trio.testing.wait_all_tasks_blocked()
        cancelled = trio.CancelScope()

        async def third() -> None:
            with cancelled:
                await ask("third")

        nursery.start_soon(third)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(ask, "fourth")
        await trio.testing.wait_all_tasks_blocked()
        cancelled.cancel()  # its call is cancelled while its question waits
        await trio.testing.wait_all_tasks_blocked()
        for line in ("a", "y", "n"):
            await lines.send.send(line)
            await trio.testing.wait_all_tasks_blocked()
