"""The HTTP half of the provider transports (`openai.py`, `anthropic.py`): one POST per model
call, answered by a Server-Sent Events stream that a sans-IO reader turns into chunks.

Theory of operation. `stream(request)` encodes the provider's body (`_body`), then *connects*: it
sends the request and waits for the response head. A 429, a 5xx (Anthropic's 529 "overloaded"
among them), a connect error or a timeout before the head is retried with exponential backoff
and jitter, slept on the model's clock (never `trio.sleep`, so scenario clocks make backoff free),
honouring `Retry-After`/`retry-after-ms` up to `retry_after_max`. Once a 2xx event stream is
accepted nothing is retried: the body is fed to the provider's `StreamReader` (`_parser`), whose
chunks are yielded as they come and whose faults become `ModelError`s with the same code. Closing
or cancelling the generator closes the response (shielded, bounded by `CLOSE_GRACE`), and the
client too when the model made it.

Errors, all `ModelError` with a one-line message naming the model and URL:

    MODEL_AUTH                 401/403 (authentication failed; check the API key)
    MODEL_NOT_FOUND            404 (wrong base URL or unknown model)
    MODEL_HTTP_ERROR           any other non-2xx that is not retried (status + body excerpt),
                               or a request httpx refuses to send
    MODEL_UNAVAILABLE          429/5xx/connect errors/timeouts still failing after the retries
                               (names the attempts and the last error)
    MODEL_BAD_RESPONSE         a 2xx that is not `text/event-stream`, lines that are not SSE,
                               or a body that cannot be decoded
    MODEL_BAD_STREAM, MODEL_STREAM_INTERRUPTED, MODEL_CONTENT_FILTERED, ...
                               what the provider's stream reader finds (see its wire module)

The API key is only ever put in the provider's header: it is not kept in the repr, and every
message this module raises or logs is scrubbed of it (`redact_secret`: the key and every run of 8
or more of its characters, e.g. a provider echoing a prefix) *before* any excerpt is cut, so a
key crossing the cut cannot leave a fragment. Errors carry no chained exception (an httpx error
holds the request and so its headers). Logging (DEBUG on the provider module's logger) names the
URL, status and attempt, never headers.
"""

from __future__ import annotations

import email.utils
import logging
import math
import random
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Protocol

import httpx
import msgspec
import trio

from ..foundation.clock import Clock, RealClock
from ..foundation.errors import (
    ModelAuthFailed,
    ModelBadResponse,
    ModelError,
    ModelHttpError,
    ModelNotFound,
    ModelStreamInterrupted,
    ModelUnavailable,
)
from ..foundation.json_values import JsonObject as Json
from .base import Chunk, ModelRequest
from .openai_wire import StreamFault, error_message, one_line

__all__ = ["CLOSE_GRACE", "DEFAULT_TIMEOUT", "REDACTED", "HttpStreamModel", "StreamReader", "redact_secret"]

# The module's own helpers log here; a model logs on its provider module's logger (`_log`).
logger = logging.getLogger(__name__)


DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=120.0, write=30.0, pool=30.0)
# Closing a response (or a client the model made) is awaited shielded, for at most this long.
CLOSE_GRACE = 5.0
# Runs of at least this many characters of the key are redacted wherever they appear.
_SECRET_FRAGMENT = 8
REDACTED = "[redacted]"
_ERROR_BODY_LIMIT = 64 * 1024


class StreamReader(Protocol):
    """A provider's sans-IO stream reader: body bytes in, chunks out; `StreamFault` on a bad
    stream. `events` counts the events read; `done` is set once the stream is complete."""

    events: int
    done: bool

    def feed(self, data: bytes) -> list[Chunk]: ...

    def end(self) -> list[Chunk]: ...


class HttpStreamModel:
    """A `Model` that POSTs one JSON body per call and reads an event stream back; a provider
    subclass says where (`PATH`), with which headers (`_headers`), what body (`_body`) and how
    the stream is read (`_parser`).

    Args:
        model: the model name sent in the body.
        base_url: API root; requests go to `<base_url><PATH>`.
        api_key: the provider's key (its header is the subclass's); `None` or `""` sends none.
        max_retries: retries after the first attempt for 429/5xx/connect errors/timeouts.
        backoff_base, backoff_max: the n-th retry waits `b/2 + uniform(0, b/2)` seconds with
            `b = min(backoff_max, backoff_base * 2**(n-1))`, unless the server says how long.
        retry_after_max: cap on a server's `Retry-After` / `retry-after-ms`.
        timeout: httpx timeouts for every request (read = the longest gap between bytes).
        client: an `httpx.AsyncClient` to reuse (pooled connections; the caller closes it).
            Without one, each `stream` call makes a client and closes it.
        rng: the jitter source (seed it for reproducible backoff).
        clock: what backoff sleeps on and `Retry-After` dates are read against (default a
            `RealClock`; `open_runtime` gives a model it builds from a spec the runtime's clock).

    Raises `ValueError` for an empty model, a non-http(s) base URL, a key that is not printable
    ASCII, or negative retry settings.
    """

    PATH = ""
    _log = logger

    def __init__(
        self,
        model: str,
        *,
        base_url: str,
        api_key: str | None,
        max_retries: int = 4,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        retry_after_max: float = 60.0,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        client: httpx.AsyncClient | None = None,
        rng: random.Random | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not model:
            raise ValueError("model name must not be empty")
        url = httpx.URL(base_url.rstrip("/"))
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if api_key and not all("!" <= ch <= "~" for ch in api_key):
            raise ValueError("api_key must be printable ASCII without spaces")
        if max_retries < 0 or backoff_base < 0 or backoff_max < 0 or retry_after_max < 0:
            raise ValueError("max_retries, backoff_base, backoff_max and retry_after_max must be >= 0")
        self.model = model
        self.url = f"{url}{self.PATH}"
        self._api_key = api_key or None
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.retry_after_max = retry_after_max
        self.timeout = timeout
        self._client = client
        self._rng = rng if rng is not None else random.Random()
        self._ssl_context: ssl.SSLContext | None = None
        self.clock: Clock = clock if clock is not None else RealClock()

    def __repr__(self) -> str:
        key = "set" if self._api_key else "none"
        return f"{type(self).__name__}(model={self.model!r}, url={self.url!r}, api_key={key})"

    async def stream(self, request: ModelRequest) -> AsyncGenerator[Chunk]:
        """Stream one completion for `request`; see the module docstring for chunks and errors.

        Use inside `contextlib.aclosing`; closing or cancelling it closes the HTTP response.
        """
        body = msgspec.json.encode(self._body(request))
        owned = self._client is None
        client = self._client if self._client is not None else self._new_client()
        response: httpx.Response | None = None
        pieces: AsyncIterator[bytes] | None = None
        try:
            response = await self._connect(client, body, self.clock)
            parser = self._parser()
            pieces = response.aiter_bytes()
            while not parser.done:
                # Errors are raised outside the `except` blocks, so they chain no httpx error.
                failure: ModelError | None = None
                piece: bytes | None = None  # (each path below sets it or raises)
                chunks: Sequence[Chunk] = ()
                try:
                    piece = await anext(pieces, None)
                except httpx.DecodingError as exc:
                    failure = self._error(ModelBadResponse, f"cannot decode the body: {self._describe(exc)}")
                except httpx.TransportError as exc:
                    failure = self._error(
                        ModelStreamInterrupted,
                        f"stream interrupted after {parser.events} events: {self._describe(exc)}",
                    )
                if failure is not None:
                    raise failure
                try:
                    chunks = parser.end() if piece is None else parser.feed(piece)
                except StreamFault as fault:
                    failure = self._error(fault.error, fault.message)
                if failure is not None:
                    raise failure
                for chunk in chunks:
                    yield chunk
                if piece is None:
                    break
        finally:
            if pieces is not None:
                await _abandon(pieces, self._redact)
            with trio.move_on_after(CLOSE_GRACE, shield=True):
                if response is not None:
                    await response.aclose()
                if owned:
                    await client.aclose()

    # -- request -------------------------------------------------------------------------------

    def _body(self, request: ModelRequest) -> Json:
        raise NotImplementedError

    def _headers(self) -> dict[str, str]:
        """The provider's headers (its key among them), besides content type and accept."""
        raise NotImplementedError

    def _parser(self) -> StreamReader:
        raise NotImplementedError

    def _new_client(self) -> httpx.AsyncClient:
        if self._ssl_context is None:  # loading the CA bundle is the slow part: do it once
            self._ssl_context = httpx.create_ssl_context()
        return httpx.AsyncClient(verify=self._ssl_context, trust_env=False)  # only the CLI reads the environment

    async def _connect(self, client: httpx.AsyncClient, body: bytes, clock: Clock) -> httpx.Response:
        """Send until a 2xx event stream answers; retry what is transient, map the rest."""
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **self._headers()}
        attempts = self.max_retries + 1
        last = ""
        for attempt in range(1, attempts + 1):
            self._log.debug("POST %s (model %s), attempt %d of %d", self.url, self.model, attempt, attempts)
            request = client.build_request("POST", self.url, content=body, headers=headers, timeout=self.timeout)
            retry_after: float | None = None
            refused: ModelError | None = None
            try:
                response = await client.send(request, stream=True)
            except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                last = self._describe(exc)
                self._log.debug("POST %s failed: %s", self.url, last)
            except httpx.HTTPError as exc:
                refused = self._error(ModelHttpError, f"request failed: {self._describe(exc)}")
            else:
                status = response.status_code
                self._log.debug("POST %s answered %d, attempt %d of %d", self.url, status, attempt, attempts)
                if 200 <= status < 300:
                    content_type = response.headers.get("content-type", "")
                    if content_type.split(";")[0].strip().lower() == "text/event-stream":
                        return response
                    excerpt = await self._excerpt(response)
                    raise self._error(
                        ModelBadResponse,
                        f"expected an event stream (text/event-stream), got {content_type or 'no content-type'!r}"
                        f" with status {status}: {excerpt}",
                        status,
                    )
                excerpt = await self._excerpt(response)
                if status in (401, 403):
                    raise self._error(
                        ModelAuthFailed, f"authentication failed ({status}): check the API key: {excerpt}", status
                    )
                if status == 404:
                    raise self._error(
                        ModelNotFound,
                        f"not found (404): check the base URL and the model name: {excerpt}",
                        status,
                    )
                if status != 429 and status < 500:
                    raise self._error(ModelHttpError, f"HTTP {status}: {excerpt}", status)
                last = f"HTTP {status}: {excerpt}"
                retry_after = _retry_after(response.headers, clock.now_ms())
            if refused is not None:
                raise refused  # outside the `except`: no httpx error (holding the headers) is chained
            if attempt == attempts:
                break
            delay = self._delay(attempt, retry_after)
            self._log.debug("retrying POST %s in %.3f s (attempt %d of %d)", self.url, delay, attempt + 1, attempts)
            await clock.sleep(delay)
        raise self._error(
            ModelUnavailable,
            f"unavailable after {attempts} attempt{'s' if attempts != 1 else ''}; last error: {last}",
        )

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.retry_after_max)
        ceiling = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1))
        return ceiling / 2 + self._rng.uniform(0, ceiling / 2)

    async def _excerpt(self, response: httpx.Response) -> str:
        """A short one-line excerpt of an error body (the provider's `error.message` if JSON)."""
        raw = bytearray()
        pieces = response.aiter_bytes()
        try:
            async for piece in pieces:
                raw += piece
                if len(raw) >= _ERROR_BODY_LIMIT:
                    break
        except httpx.HTTPError:
            pass  # the excerpt is a courtesy; the status already says what happened
        finally:
            await _abandon(pieces, self._redact)
            with trio.move_on_after(CLOSE_GRACE, shield=True):
                await response.aclose()
        text = bytes(raw[:_ERROR_BODY_LIMIT]).decode("utf-8", "replace")
        try:
            text = error_message(msgspec.json.decode(text)) or text
        except msgspec.DecodeError:
            pass  # not a JSON error body: its text is the message
        return one_line(self._redact(text)) or "(empty body)"

    # -- errors --------------------------------------------------------------------------------

    def _redact(self, text: str) -> str:
        return redact_secret(text, self._api_key)

    def _describe(self, exc: BaseException) -> str:
        return _describe(exc, self._redact)

    def _error(self, error: type[ModelError], detail: str, status: int | None = None) -> ModelError:
        message = self._redact(f"model {self.model!r} at {self.url}: {detail}")
        self._log.debug("%s: %s", error.code, message)
        return error(message, status=status)


async def _abandon(pieces: AsyncIterator[bytes], redact: Callable[[str], str]) -> None:
    """Finish an httpx body iterator we stop reading early, without reading on.

    httpx and httpcore read bodies through nested async generators; closing the outer one or the
    response leaves the inner ones suspended, and Trio warns when the garbage collector finds
    them (encode/httpx#3686). Cancelling the pending read (or reaching the end of what is already
    buffered) unwinds them all; httpcore then closes the connection, which we were doing anyway.
    """
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            while True:
                await anext(pieces)
        except StopAsyncIteration:
            pass
        except Exception as exc:  # the body is abandoned: how reading it fails no longer matters
            logger.debug("abandoned body: %s", _describe(exc, redact))


# -- small helpers -----------------------------------------------------------------------------


def _retry_after(headers: httpx.Headers, now_ms: int) -> float | None:
    """Seconds the server asked us to wait (`retry-after-ms`, then `Retry-After` seconds or date)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            value = float(raw_ms) / 1000
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        return max(0.0, when.timestamp() - now_ms / 1000)
    return value if math.isfinite(value) and value >= 0 else None


def _describe(exc: BaseException, redact: Callable[[str], str]) -> str:
    detail = one_line(redact(str(exc)))
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def redact_secret(text: str, secret: str | None, *, fragment: int = _SECRET_FRAGMENT) -> str:
    """`text` with `secret` replaced by `[redacted]` wherever it appears, and also every run of at
    least `fragment` characters that is part of it (a provider may echo a prefix, a masked key
    or the key's tail; a cut excerpt may hold a piece). Runs that overlap or touch are replaced
    once. A secret shorter than `fragment` is only redacted whole.

    Redact before cutting an excerpt: cutting can only shorten what is left, never create a
    fragment, since no run of `fragment` characters of the secret survives redaction."""
    if not secret or not text:
        return text
    n = min(fragment, len(secret))
    spans: list[list[int]] = []
    # Sliding window: text[i:j] is always part of `secret` (a part of a part is a part), so each
    # start only tries to grow the window further.
    i = j = 0
    size = len(text)
    while i <= size - n:
        if j < i:
            j = i
        while j < size and text[i : j + 1] in secret:
            j += 1
        if j - i >= n:
            if spans and spans[-1][1] >= i:
                spans[-1][1] = j
            else:
                spans.append([i, j])
        i += 1
    if not spans:
        return text
    out: list[str] = []
    last = 0
    for start, end in spans:
        out.append(text[last:start])
        out.append(REDACTED)
        last = end
    out.append(text[last:])
    return "".join(out)
