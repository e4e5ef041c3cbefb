"""Answer text streamed to an ACP client as the model writes it, in order with the session's
durable events (the `session/update`s the forwarder sends).

Pure: one `LiveText` per open session; text deltas and durable events in, updates out. The
rules (the chat's view follows the same, runtime/hosts/chat/view.py `ChatView`):

- A model call is numbered by the session's `assistant/message` count when it began (`call`):
  its reply is the next such event. Its text is sent once every event durable when its first
  delta arrived (its turn's start and input, earlier tool results) has been sent (`gate`), and
  every earlier reply has (`call == replies`): the event stream may deliver those after a fast
  model has begun, and the text waits for them.
- The reply's durable `assistant/message` then sends only what was not streamed, under the
  streamed chunks' `messageId` (nothing when all was); a reply nothing was streamed for (a
  model that does not stream, a reply begun before the session was opened here) is sent whole
  under its durable message id, as `session/load` replays it.
"""

from __future__ import annotations

import msgspec
from subagents.storage import Event, decode_payload

from ...foundation.json_values import JsonObject as Json
from .updates import agent_text, message_text, updates_for

__all__ = ["LiveText"]


class LiveText:
    """The streamed text of one session and how far its durable events have been sent."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.started = False  # `start` was called: before it, text is only kept
        self.shown = 0  # the session's next seq to send
        self.replies = 0  # the session's `assistant/message` events sent (or before `start`)
        self._gates: dict[int, int] = {}  # by call: the session's durable end at its first delta
        self._waiting: dict[int, list[str]] = {}  # by call: text not sent yet
        self._streamed: dict[int, list[str]] = {}  # by call: text sent

    def start(self, shown: int, replies: int) -> None:
        """Begin sending after the first `shown` events, `replies` of them replies (what was
        kept before may then go: `release`)."""
        self.started, self.shown, self.replies = True, shown, replies
        self._forget_before(replies)

    def text(self, call: int, text: str, durable_next: int) -> None:
        """A text delta of model call `call`; `durable_next` is the session's durable end now."""
        if not text or call < self.replies:
            return
        self._gates.setdefault(call, durable_next)
        self._waiting.setdefault(call, []).append(text)

    def release(self) -> list[Json]:
        """The waiting text that may be sent now (one chunk)."""
        call = self.replies
        if not self.started or call not in self._waiting or self.shown < self._gates[call]:
            return []
        text = "".join(self._waiting.pop(call))
        self._streamed.setdefault(call, []).append(text)
        return [agent_text(text, _live_id(call))]

    def event(self, event: Event) -> list[Json]:
        """The updates for the session's next durable event, then any text it released."""
        if event.type == "assistant/message":
            out = self._reply(event)
        else:
            out = updates_for([event], session_id=self.session_id)
        self.shown = event.seq + 1
        return out + self.release()

    def _reply(self, event: Event) -> list[Json]:
        data = msgspec.to_builtins(decode_payload(event, session_id=self.session_id))
        message = data["message"]
        call = self.replies
        sent = "".join(self._streamed.get(call, ()))
        self.replies += 1
        self._forget_before(self.replies)  # text still waiting for it is in the record
        text = message_text(message)
        if sent and text.startswith(sent):
            rest = text[len(sent) :]
            return [agent_text(rest, _live_id(call))] if rest else []
        # Nothing streamed (or, never expected, a record that differs from what streamed): the
        # record whole, as a replay sends it.
        return updates_for([event], session_id=self.session_id)

    def _forget_before(self, call: int) -> None:
        for table in (self._gates, self._waiting, self._streamed):
            for old in [c for c in table if c < call]:
                del table[old]


def _live_id(call: int) -> str:
    """The `messageId` of a streamed reply (its durable id is not known until it is written)."""
    return f"reply-{call + 1}"
