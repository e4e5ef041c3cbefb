"""The OpenAI-compatible chat-completions transport (docs/design.md, "The agent loop and models"):
`POST <base_url>/chat/completions` with `stream: true`, read back as Server-Sent Events.

Theory of operation. `stream(request)` converts the logged messages and tool specs to the chat
format (`openai_wire`) and sends them with the HTTP machinery every provider shares
(`http_stream.HttpStreamModel`: retries with backoff and `Retry-After`, error mapping, closing,
redaction); the 2xx event stream is read by the sans-IO `openai_wire.StreamParser`.

Errors, all `ModelError` with a one-line message naming the model and URL:

    MODEL_AUTH                 401/403 (authentication failed; check the API key)
    MODEL_NOT_FOUND            404 (wrong base URL or unknown model)
    MODEL_HTTP_ERROR           any other non-2xx that is not retried (status + body excerpt),
                               or a request httpx refuses to send
    MODEL_UNAVAILABLE          429/5xx/connect errors/timeouts still failing after the retries
                               (names the attempts and the last error)
    MODEL_BAD_RESPONSE         a 2xx that is not `text/event-stream`, lines that are not SSE,
                               or a body that cannot be decoded
    MODEL_BAD_STREAM           an event's data is not JSON or not a chat-completion chunk, the
                               provider reported an error inside the stream, or `[DONE]` came
                               without any `finish_reason`
    MODEL_STREAM_INTERRUPTED   the body broke (connection dropped, read timeout) or ended
                               cleanly before both `[DONE]` and a `finish_reason`
    MODEL_CONTENT_FILTERED     `finish_reason: content_filter`

How finish reasons, usage and delta fields are read: see `openai_wire`.

The API key is only ever put in the `Authorization` header: it is not kept in the repr, and
every message this module raises or logs is scrubbed of it (`redact_secret`: the key and every
run of 8 or more of its characters, e.g. a provider echoing a prefix) *before* any excerpt is cut,
so a key crossing the cut cannot leave a fragment. Errors carry no chained exception (an httpx
error holds the request and so its headers). Logging (DEBUG on this module's logger) names the
URL, status and attempt, never headers.
"""

from __future__ import annotations

import logging

from ..foundation.json_values import JsonObject as Json
from .base import ModelRequest
from .http_stream import CLOSE_GRACE as CLOSE_GRACE
from .http_stream import DEFAULT_TIMEOUT as DEFAULT_TIMEOUT
from .http_stream import HttpStreamModel, StreamReader
from .http_stream import redact_secret as redact_secret
from .openai_wire import StreamParser, openai_messages, openai_tools

__all__ = ["CLOSE_GRACE", "DEFAULT_TIMEOUT", "OpenAIChatModel", "redact_secret"]

logger = logging.getLogger(__name__)


class OpenAIChatModel(HttpStreamModel):
    """A `Model` speaking the OpenAI chat-completions streaming protocol.

    `model` is the name sent in the body (`gpt-4o-mini`, `deepseek-chat`, ...); requests go to
    `<base_url>/chat/completions`; `api_key` is sent as `Authorization: Bearer <key>` (`None` or
    `""` sends no header). The other arguments are `HttpStreamModel`'s: retries, backoff,
    timeouts, a client to reuse, the jitter source and the clock. Raises `ValueError` for an empty
    model, a non-http(s) base URL, a key that is not printable ASCII, or negative retry settings.
    """

    PATH = "/chat/completions"
    _log = logger

    def _body(self, request: ModelRequest) -> Json:
        body: Json = {
            "model": self.model,
            "messages": openai_messages(request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = openai_tools(request.tools)
        return body

    def _headers(self) -> dict[str, str]:
        return {} if self._api_key is None else {"Authorization": f"Bearer {self._api_key}"}

    def _parser(self) -> StreamReader:
        return StreamParser(self._redact)
