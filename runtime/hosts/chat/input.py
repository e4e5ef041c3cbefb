"""One reader of the person's lines for two askers: the chat's prompt and permission questions
(README "Chat", "Permissions").

A tool call whose permission is `ask` may come from any agent of the session's tree, while the
person is idle at the prompt or while their own turn runs. Only one read may be in progress, so
whoever reads holds `_turn_to_read`: the chat's loop while its prompt is up, or a question
asked while nobody reads. A question that arrives while the prompt is up is queued and the
prompt is interrupted (on a terminal it returns `INTERRUPTED`; a pipe cannot be interrupted, so
the next line it gives answers the question); the holder answers queued questions first, one
at a time, then goes back to its prompt.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

import attrs
import trio

from ...tools.permissions import PermissionAnswer, PermissionRequest
from ..run_progress import RunProgress
from .terminal import INTERRUPTED

__all__ = ["Asker", "Lines", "parse_answer"]

QUESTION = "allow? [y]es / [a]lways / [N]o "


class Lines(Protocol):
    """Where the person's lines come from."""

    async def read(self, prompt: str) -> str | object | None:
        """The next line (without its newline), `CTRL_C`, or None at end of input."""
        ...

    def progress(self, progress: RunProgress) -> None:
        """The session's activity and child tree changed (a terminal shows it under the prompt)."""
        ...

    def interrupt(self) -> None:
        """Take away the prompt of the read in progress, if the reader can (thread-safe)."""
        ...

    # Whether lines typed while a turn runs reach the chat (a terminal: steering, Esc); a pipe's
    # next line waits for the turn's end, so a scripted session stays a sequence of turns.
    steers: bool

    def turn_running(self, running: bool) -> None:
        """A turn starts or ends (a terminal binds Esc to interrupting it meanwhile)."""
        ...


def parse_answer(line: str | object | None) -> PermissionAnswer:
    """The person's answer to a permission question: y/yes, a/always; anything else denies."""
    if isinstance(line, str):
        word = line.strip().lower()
        if word in ("y", "yes"):
            return PermissionAnswer("allow")
        if word in ("a", "always"):
            return PermissionAnswer("always")
    return PermissionAnswer("deny", "the person declined the permission request")


@attrs.define
class _Question:
    request: PermissionRequest
    answer: PermissionAnswer | None = None
    done: trio.Event = attrs.field(factory=trio.Event)


class Asker:
    """Reads lines for the chat's prompt and answers permission questions, one read at a time.
    `say` shows a question before it is asked (a pipe shows no prompt), naming the session that
    asks: `root_id`'s own, or a subagent's."""

    def __init__(self, lines: Lines, say: Callable[[str], None], root_id: str | None = None) -> None:
        self.lines = lines
        self.say = say
        self.root_id = root_id  # the chat's session: a question from any other names who asks
        self._turn_to_read = trio.Lock()
        self._questions: deque[_Question] = deque()
        self._prompt_up = False  # the holder is at the chat's prompt (a question interrupts it)

    async def prompt(self, text: str) -> str | object | None:
        """The chat's next line; questions that come meanwhile are answered first."""
        async with self._turn_to_read:
            while True:
                await self._answer_questions()
                self._prompt_up = True
                try:
                    line = await self.lines.read(text)
                finally:
                    self._prompt_up = False
                if line is INTERRUPTED:
                    continue
                if self._questions and isinstance(line, str):
                    self._settle(self._questions.popleft(), line)  # a pipe's line, read before the question
                    continue
                return line

    async def approve(self, request: PermissionRequest) -> PermissionAnswer:
        """Ask the person about one tool call (the runtime's `Approver`)."""
        question = _Question(request)
        self._questions.append(question)
        if self._prompt_up:
            self.lines.interrupt()  # its holder answers the queue, then prompts again
        elif not self._turn_to_read.locked():
            async with self._turn_to_read:
                await self._answer_questions()
        try:
            await question.done.wait()
        finally:
            if not question.done.is_set() and question in self._questions:
                self._questions.remove(question)  # its call was cancelled: nobody wants the answer
        assert question.answer is not None
        return question.answer

    async def _answer_questions(self) -> None:
        while self._questions:
            question = self._questions[0]
            asking = question.request.session_id
            who = "this session" if asking == self.root_id else f"subagent {asking}"
            self.say(f"permission ({who}): {question.request.title}")
            line = await self.lines.read(QUESTION)
            if line is INTERRUPTED:
                continue  # a stale interrupt: ask again
            if self._questions and self._questions[0] is question:
                self._questions.popleft()  # (a cancelled call's question is gone already)
            self._settle(question, line)

    def _settle(self, question: _Question, line: str | object | None) -> None:
        question.answer = parse_answer(line)
        self.say(f"({'allowed' if question.answer.outcome != 'deny' else 'denied'}: {question.request.tool})")
        question.done.set()
