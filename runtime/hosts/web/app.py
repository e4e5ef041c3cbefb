"""The console's ASGI app (Starlette): its routes, the pages' error forms and the security
rules of runtime/hosts/web/security.py applied to every request.

Built over a read side the caller opened (runtime/read_side.py) and keeps open while the app
serves; the app itself holds no state the store does not hold, beyond its token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import attrs
import jinja2
import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from subagents.storage import InvalidSessionId, StorageError, StoreUnreachable, check_session_id

from ...foundation.errors import QuerySessionNotFound, SessionQueryError, SubagentError
from .controls import Control, ControlRefused, deliver
from .feed_paths import OldFeedPath
from .feeds import Broken, open_feed
from .pulse import CorpusPulse, LiveRoute, StateRoute
from .security import AUTH_COOKIE, Access, security_headers
from .stalled import TurnMemo
from .views import overview, roots_page, session_view, subtree

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send
    from subagents.storage import LogInfo

    from ...read_side import ReadSide

__all__ = ["WebSettings", "build_app"]

_HERE = Path(__file__).parent
_CONTROLS: dict[str, Control] = {"send": "send", "interrupt": "interrupt", "stop": "stop", "stop-tree": "stop-tree"}
MAX_FORM = 64 * 1024  # bytes of a form body (a message to an agent included)


@attrs.frozen(kw_only=True)
class WebSettings:
    root: str  # the file store's folder (its mailbox lives there), or the working folder
    store: str | None = None  # a PostgreSQL store's URL (`--store`), else None: the folder `root`
    access: Access
    read_only: bool = False
    # Whether reads need the token too (a console reachable from other machines).
    private_reads: bool = False
    # The `Host` headers this console answers (a DNS-rebinding page names another).
    hosts: frozenset[str] = frozenset()
    # Seconds between two looks at the corpus for the live pages (runtime/hosts/web/pulse.py).
    live_interval: float = 1.0


def _environment() -> jinja2.Environment:
    # autoescape everywhere: every text from a log is untrusted input.
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(_HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined
    )


def build_app(side: ReadSide, settings: WebSettings) -> ASGIApp:
    """The console over `side`, with its security rules around it."""
    templates = _environment()
    access = settings.access

    def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        authed = access.cookie_matches(request.cookies.get(AUTH_COOKIE))
        body = templates.get_template(name).render(
            read_only=settings.read_only, authed=authed, csrf=access.csrf_value if authed else "", **context
        )
        return HTMLResponse(body, status_code=status)

    def problem(request: Request, status: int, title: str, message: str) -> HTMLResponse:
        return page(request, "message.html", status, title=title, message=message)

    def session_arg(request: Request) -> str:
        sid = str(request.path_params["session_id"])
        try:
            check_session_id(sid)
        except InvalidSessionId:
            raise HTTPException(404, "no such session: not a valid session id") from None
        return sid

    memo = TurnMemo()  # the children nobody runs whose last turn the overviews learned

    async def overview_page(request: Request) -> Response:
        return page(request, "overview.html", view=await overview(side, memo))

    async def tree_page(request: Request) -> Response:
        try:
            number = int(request.query_params.get("page", "1"))
        except ValueError:
            raise HTTPException(400, "page must be a whole number") from None
        return page(request, "tree.html", view=await roots_page(side, number))

    async def subtree_page(request: Request) -> Response:
        sid = session_arg(request)
        try:
            view = await subtree(side, sid)
        except SubagentError as exc:  # ListingParentNotFound
            raise HTTPException(404, exc.message) from None
        return page(request, "subtree.html", root=sid, view=view)

    async def session_page(request: Request) -> Response:
        sid = session_arg(request)
        try:
            before = int(request.query_params["before"]) if "before" in request.query_params else None
        except ValueError:
            raise HTTPException(400, "before must be a whole number") from None
        try:
            view = await session_view(side, sid, before)
        except QuerySessionNotFound:
            raise HTTPException(404, f'session "{sid}" not found') from None
        except SessionQueryError as exc:
            if isinstance(exc.__cause__, StoreUnreachable):
                raise
            return page(request, "damaged.html", session_id=sid, damage=exc.message)
        except StorageError as exc:  # a payload the transcript cannot decode
            seq = getattr(exc, "seq", None)
            at = f" (seq {seq})" if seq is not None and f"seq {seq}" not in str(exc) else ""
            return page(request, "damaged.html", session_id=sid, damage=f"{exc}{at}")
        return page(request, "session.html", view=view)

    async def login_form(request: Request) -> Response:
        return page(request, "login.html", failed=False)

    async def login(request: Request) -> Response:
        form = await _form(request)
        if not access.token_matches(form.get("token", "")):
            return page(request, "login.html", 403, failed=True)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(AUTH_COOKIE, access.cookie_value, httponly=True, samesite="strict", path="/")
        return response

    async def control(request: Request) -> Response:
        sid = session_arg(request)
        action = request.path_params["action"]
        if action not in _CONTROLS:
            raise HTTPException(404, "no such page")
        if settings.read_only:
            return problem(request, 403, "Read-only", "this console is read-only (--read-only): nothing was sent")
        form = await _form(request)
        if not access.cookie_matches(request.cookies.get(AUTH_COOKIE)):
            return problem(request, 403, "Not signed in", "sign in with the console's token first: nothing was sent")
        if not access.csrf_matches(form.get("csrf")) or not _same_origin(request):
            return problem(request, 403, "Refused", "the form's CSRF check failed: nothing was sent")
        try:
            outcome = await deliver(
                side, settings.root, sid, _CONTROLS[action], form.get("text", ""), store=settings.store
            )
        except ControlRefused as exc:
            return problem(request, exc.status, "Not delivered", exc.message)
        return page(request, "outcome.html", session_id=sid, outcome=outcome)

    async def not_found(request: Request, exc: Exception) -> Response:
        return problem(request, 404, "Not found", str(getattr(exc, "detail", "")) or "no such page")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return problem(request, exc.status_code, "Error", str(exc.detail))

    async def store_error(request: Request, exc: Exception) -> Response:
        return problem(request, 503, "Store unavailable", f"the store did not answer: {exc}")

    pulse = CorpusPulse(side, settings.live_interval)
    tree_feed = _EventsRoute(side, session_arg, tree=True)
    session_feed = _EventsRoute(side, session_arg)
    routes = [
        Route("/", overview_page),
        Route("/live", LiveRoute(pulse)),
        Route("/live/state", StateRoute(pulse)),
        Route("/tree", tree_page),
        # `:path`: a session id may hold `/` (the links quote every other special character).
        # The feeds sit under their own prefix: a session id ending in `/events` is a page.
        Route("/events/tree/{session_id:path}", tree_feed),
        Route("/events/session/{session_id:path}", session_feed),
        # The first feed paths, kept where they are unambiguous (runtime/hosts/web/feed_paths.py).
        Route("/tree/{session_id:path}/events", OldFeedPath(side, tree_feed, subtree_page)),
        Route("/tree/{session_id:path}", subtree_page),
        Route("/session/{session_id:path}/events", OldFeedPath(side, session_feed, session_page)),
        Route("/session/{session_id:path}/{action:str}", control, methods=["POST"]),
        Route("/session/{session_id:path}", session_page),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={
            404: not_found,
            HTTPException: http_error,
            StoreUnreachable: store_error,
            SessionQueryError: store_error,
        },
    )
    return _Guard(app, settings)


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form's fields (the first value of each); a body too large or not text is
    an empty form (every check then fails)."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise HTTPException(413, "the form is too large")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=16)
    except (UnicodeDecodeError, ValueError):
        return {}
    return {key: values[0] for key, values in fields.items()}


def _same_origin(request: Request) -> bool:
    """An `Origin` (or, without one, a `Referer`) the browser sent must name this console."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if origin is None:
        return True  # not a browser's cross-site form (those carry an Origin): the CSRF value decides
    return urlsplit(origin).netloc == request.headers.get("host", "")


class _EventsRoute:
    """`GET /events/session/ID`: the session's durable events from `?after=SEQ` on, as
    server-sent events, each `{"seq", "type", "lines"}` (lines as `show` renders them), until
    the client goes away. With `tree` (`GET /events/tree/ID`): the events its tree makes from
    now on — the root's and every descendant's the stream knows from the catalogs — each
    `{"session_id", "seq", "type"}`, for the tree page to reload its rows. A raw ASGI endpoint:
    the stream's nursery lives in this call, not in a generator a response would iterate."""

    def __init__(self, side: ReadSide, session_arg: Any, *, tree: bool = False) -> None:
        self.side = side
        self.session_arg = session_arg
        self.tree = tree

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        sid = self.session_arg(request)
        try:
            after = int(request.query_params.get("after", "0"))
        except ValueError:
            raise HTTPException(400, "after must be a whole number") from None
        try:
            info, _held = await self.side.query.stat(sid)
        except StorageError:
            info = None
        if info is None:
            raise HTTPException(404, f'session "{sid}" not found')
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), *security_headers()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if info.damage is not None:  # the stream would stop following it in silence: say so, and end
            await send({"type": "http.response.body", "body": _problem(f"the log is damaged ({info.damage})")})
            return
        async with trio.open_nursery() as nursery:

            async def until_gone() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                nursery.cancel_scope.cancel()  # the client went away: nothing more to read

            nursery.start_soon(until_gone)
            try:
                if self.tree:
                    await self._tree(sid, info, send)
                else:
                    await self._pump(sid, after, send)
            except* (StorageError, SessionQueryError) as group:
                # A log damaged (or a store gone) under the stream: said once, then the stream
                # ends; the page's script shows it and looks again later.
                await send({"type": "http.response.body", "body": _problem(str(_first_leaf(group))), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            nursery.cancel_scope.cancel()

    async def _tree(self, sid: str, info: LogInfo, send: Send) -> None:
        from .feed_start import tree_ends

        # From each log's end as the tree's listing knows it (runtime/hosts/web/feed_start.py):
        # no history is read, the root's to find its children neither.
        known = await tree_ends(self.side, sid, info)
        async with open_feed(
            self.side.query, sid, from_seq=int(info.event_count), descendants=True, known=known
        ) as stream:
            await send({"type": "http.response.body", "body": b": open\n\n", "more_body": True})
            async for item in stream:
                if isinstance(item, Broken):  # a log damaged under the feed: its row says so now
                    kind = "damaged" if item.damaged else "unreadable"
                    data = json.dumps(
                        {"session_id": item.session_id, "seq": item.seq, "type": kind, "problem": item.problem}
                    )
                else:
                    data = json.dumps({"session_id": item.session_id, "seq": item.event.seq, "type": item.event.type})
                await send({"type": "http.response.body", "body": f"data: {data}\n\n".encode(), "more_body": True})

    async def _pump(self, sid: str, after: int, send: Send) -> None:
        from ..transcript import render, transcript

        async with open_feed(self.side.query, sid, from_seq=max(after, 0), descendants=False) as stream:
            await send({"type": "http.response.body", "body": b": open\n\n", "more_body": True})
            async for item in stream:
                if isinstance(item, Broken):  # damaged under the feed: said once, and the feed ends
                    await send(
                        {"type": "http.response.body", "body": _problem(_damage(item), item.damaged), "more_body": True}
                    )
                    return
                for entry in transcript([item.event], session_id=sid)[:-1]:  # no usage total
                    data = json.dumps({"seq": item.event.seq, "type": entry["type"], "lines": render([entry])})
                    await send({"type": "http.response.body", "body": f"data: {data}\n\n".encode(), "more_body": True})


class _Guard:
    """Around the app: the `Host` check, the token for reads when reads are private, and the
    security headers on every response."""

    def __init__(self, app: ASGIApp, settings: WebSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        named = [value for name, value in scope["headers"] if name.lower() == b"host"]
        # Two: the check below and the origin check could each read another one (h11 refuses
        # them already under HTTP/1.1; the app does not count on its server for it).
        if len(named) > 1:
            await _plain(send, 400, "a request names one host")
            return
        host = named[0].decode("latin-1") if named else ""
        path = scope["path"]
        if self.settings.hosts and _host_name(host) not in self.settings.hosts:
            await _plain(send, 421, "this console does not answer to that host name")
            return
        if self.settings.private_reads and not (path.startswith("/static/") or path == "/login"):
            cookies = Request(scope).cookies
            if not self.settings.access.cookie_matches(cookies.get(AUTH_COOKIE)):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 303,
                        "headers": [(b"location", b"/login"), *security_headers()],
                    }
                )
                await send({"type": "http.response.body", "body": b""})
                return

        async def secured(message: Any) -> None:
            if message["type"] == "http.response.start":
                extra = security_headers()
                names = {name for name, _ in extra}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": [*kept, *extra]}
            await send(message)

        await self.app(scope, receive, secured)


def _problem(text: str, damaged: bool | None = None) -> bytes:
    # `damaged`, when known: true, the page stops asking (it would hear the same); false, it
    # asks again later (a store that failed a read may answer the next).
    data: dict[str, object] = {"problem": text} if damaged is None else {"problem": text, "damaged": damaged}
    return f"event: problem\ndata: {json.dumps(data)}\n\n".encode()


def _damage(broken: Broken) -> str:
    if not broken.damaged:
        return f"the log could not be read any more: {broken.problem}"
    at = f" at seq {broken.seq}" if broken.seq is not None and f"seq {broken.seq}" not in broken.problem else ""
    return f"the log is damaged{at}: {broken.problem}"


def _first_leaf(group: BaseExceptionGroup[Exception]) -> BaseException:
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first


def _host_name(host: str) -> str:
    """A `Host` header without its port (`[::1]:8765` → `[::1]`)."""
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.partition(":")[0]


async def _plain(send: Send, status: int, text: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), *security_headers()],
        }
    )
    await send({"type": "http.response.body", "body": text.encode()})
