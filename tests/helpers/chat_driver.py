"""Drivers for `subagents chat` subprocesses: `Chat` on pipes, `Terminal` on a pseudo-terminal,
and `show_json` to read a session back."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from cli_process import CLI, clean_env, write_script

__all__ = ["TIMEOUT", "Chat", "LineProcess", "Terminal", "show_json"]

TIMEOUT = 60  # real seconds: only reached if the chat hangs


class LineProcess:
    """A subprocess whose stdout lines are read in a thread: `expect` waits for an output line
    matching a regex (returning the match); `seen` holds every line read so far."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], *, stdin: Any = None) -> None:
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.seen: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def expect(self, pattern: str) -> re.Match[str]:
        while True:
            try:
                line = self._lines.get(timeout=TIMEOUT)
            except queue.Empty:
                self.proc.kill()
                raise AssertionError(f"no line matching {pattern!r}; seen: {self.seen}") from None
            if line is None:
                raise AssertionError(f"the process ended before a line matching {pattern!r}; seen: {self.seen}")
            self.seen.append(line)
            match = re.search(pattern, line)
            if match:
                return match

    def interrupt(self) -> tuple[int, str]:
        """Ctrl-C (SIGINT) unless it ended already, then its exit status and stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        assert self.proc.stderr is not None
        return self.proc.returncode, self.proc.stderr.read()


class Chat(LineProcess):
    """A `subagents chat` subprocess on pipes: `line` writes one line."""

    def __init__(self, tmp_path: Path, script: Any, *args: str) -> None:
        model = write_script(tmp_path / "s.json", script)
        self.root = str(tmp_path / "root")
        argv = [*CLI, "chat", "--root", self.root, "--model", model, "--compression", "none", *args]
        super().__init__(argv, tmp_path, clean_env(COLUMNS="200"), stdin=subprocess.PIPE)

    def line(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def finish(self) -> tuple[int, str, str]:
        """Close stdin and wait for the exit: (status, the rest of stdout, stderr)."""
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self.proc.stdin.close()
        status = self.proc.wait(timeout=TIMEOUT)
        rest = []
        while (line := self._lines.get(timeout=TIMEOUT)) is not None:
            rest.append(line)
        self.seen.extend(rest)
        return status, "\n".join(rest), self.proc.stderr.read()


def show_json(root: str, session_id: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [*CLI, "show", "--root", root, "--json", session_id],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    entries: list[dict[str, Any]] = json.loads(done.stdout)
    return entries


_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x08\r]")


_CURSOR_QUESTION = b"\x1b[6n"


class Terminal:
    """`subagents chat` on a pseudo-terminal (stdlib `pty`): `keys` types, `expect` waits for a
    regex in the output with the terminal's escape sequences taken out."""

    def __init__(self, tmp_path: Path, script: Any) -> None:
        import pty

        model = write_script(tmp_path / "s.json", script)
        self.root = str(tmp_path / "root")
        argv = [*CLI, "chat", "--root", self.root, "--model", model, "--compression", "none"]
        # prompt-toolkit asks where the cursor is (it draws the bottom toolbar only once it
        # knows the rows below): `_more` answers each request as a terminal would.
        env = clean_env(
            TERM="xterm-256color",
            COLUMNS="200",
            LINES="50",
            XDG_STATE_HOME=str(tmp_path / "state"),  # the chat's line history
        )
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: becomes the chat
            os.chdir(tmp_path)
            os.execvpe(argv[0], argv, env)
        self.raw = b""
        self.answered = 0  # cursor-position requests answered
        # Where the next expect starts looking. Lines printed while the prompt is up come from
        # prompt-toolkit's stdout proxy, which may draw the next prompt first: on the screen the
        # line is above the prompt, in the raw output the prompt may come before it (so the
        # patterns for printed lines are not anchored at the line start).
        self.at = 0

    def text(self) -> str:
        return _ESCAPE.sub("", self.raw.decode("utf-8", "replace"))

    def keys(self, data: bytes) -> None:
        os.write(self.fd, data)

    def _more(self, until: float) -> bool:
        import select

        ready, _, _ = select.select([self.fd], [], [], max(0.0, until - time.monotonic()))
        if not ready:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # the chat closed the terminal
            return False
        self.raw += data
        asked = self.raw.count(_CURSOR_QUESTION)
        for _ in range(asked - self.answered):
            os.write(self.fd, b"\x1b[1;1R")  # the cursor at the top: the whole height below it
        self.answered = asked
        return bool(data)

    def expect(self, pattern: str) -> re.Match[str]:
        until = time.monotonic() + TIMEOUT  # a hang guard only
        while True:
            match = re.compile(pattern, re.MULTILINE).search(self.text(), self.at)
            if match:
                self.at = match.end()
                return match
            if not self._more(until):
                raise AssertionError(f"no {pattern!r} in the terminal: {self.text()[-2000:]!r}")

    def exit_status(self) -> int:
        until = time.monotonic() + TIMEOUT
        while time.monotonic() < until:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            self._more(time.monotonic() + 0.05)  # keep reading so the chat never blocks on output
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError("the chat did not exit")
