"""The Anthropic Messages API transport (`anthropic:MODEL`; docs/design.md, "The agent loop and
models"): `POST <base_url>/v1/messages` with `stream: true`, read back as Server-Sent Events.

Theory of operation. `stream(request)` maps the logged messages and tool specs to a Messages API
body (`anthropic_wire.anthropic_body`: system prompt as `system`, tool results as `tool_result`
blocks, thinking blocks sent back, prompt-cache breakpoints on the stable prefix) and sends it with
the HTTP machinery every provider shares (`http_stream.HttpStreamModel`): retries with backoff on
429, 5xx — 529 "overloaded" among them — and connect errors, honouring `retry-after`; one-line
errors naming the model and URL, the key redacted. The 2xx event stream is read by the sans-IO
`anthropic_wire.StreamParser` (text, tool calls by block index, whole thinking blocks, usage with
cache reads and writes, the stop reason).

The key goes only in the `x-api-key` header, beside `anthropic-version`. The official `anthropic`
SDK is not used at run time (its async client is asyncio- and pydantic-bound and heavy to import);
the tests validate every body this module sends against the SDK's request types.
"""

from __future__ import annotations

import logging
import random

import httpx

from ..foundation.clock import Clock
from ..foundation.json_values import JsonObject as Json
from .anthropic_wire import ANTHROPIC_VERSION, AnthropicOptions, StreamParser, anthropic_body
from .base import ModelRequest
from .http_stream import DEFAULT_TIMEOUT, HttpStreamModel, StreamReader

__all__ = ["DEFAULT_BASE_URL", "AnthropicModel"]

logger = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.anthropic.com"


class AnthropicModel(HttpStreamModel):
    """A `Model` speaking Anthropic's streaming Messages API.

    Args:
        model: the model name sent in the body (`claude-sonnet-4-5`, ...).
        base_url: API root without `/v1` (as `ANTHROPIC_BASE_URL`); requests go to
            `<base_url>/v1/messages`.
        api_key: sent as `x-api-key`; `None` or `""` sends none.
        options: `max_tokens`, extended thinking's budget and prompt caching (`AnthropicOptions`;
            default: 8192 tokens, no thinking, caching on).
        The rest are `HttpStreamModel`'s: retries, backoff, `Retry-After` cap, timeouts, a client
        to reuse, the jitter source and the clock.

    Raises `ValueError` for an empty model, a non-http(s) base URL, a key that is not printable
    ASCII, negative retry settings, or a thinking budget the API would refuse (below 1024, or not
    below `max_tokens`).
    """

    PATH = "/v1/messages"
    _log = logger

    def __init__(
        self,
        model: str,
        *,
        base_url: str = DEFAULT_BASE_URL,
        api_key: str | None,
        options: AnthropicOptions | None = None,
        max_retries: int = 4,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        retry_after_max: float = 60.0,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        client: httpx.AsyncClient | None = None,
        rng: random.Random | None = None,
        clock: Clock | None = None,
    ) -> None:
        options = options if options is not None else AnthropicOptions()
        if options.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {options.max_tokens}")
        budget = options.thinking_budget
        if budget is not None and not 1024 <= budget < options.max_tokens:
            raise ValueError(
                f"the thinking budget must be at least 1024 and below max_tokens ({options.max_tokens}), got {budget}"
            )
        super().__init__(
            model,
            base_url=base_url,
            api_key=api_key,
            max_retries=max_retries,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            retry_after_max=retry_after_max,
            timeout=timeout,
            client=client,
            rng=rng,
            clock=clock,
        )
        self.options = options
        root = self.url.removesuffix(self.PATH)
        if root.endswith("/v1"):  # a base URL given with the version path, as some proxies document it
            self.url = f"{root}/messages"

    def _body(self, request: ModelRequest) -> Json:
        return anthropic_body(self.model, request, self.options)

    def _headers(self) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if self._api_key is not None:
            headers["x-api-key"] = self._api_key
        return headers

    def _parser(self) -> StreamReader:
        return StreamParser(self._redact)
