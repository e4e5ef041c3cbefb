"""What the fake provider servers (openai_server.py, fake_anthropic.py) share: a threaded HTTP
server on a loopback port, a queue of scripted replies, what was asked and refused, streams held
open until the client leaves, and a shutdown that ends those too."""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, Self, TypeVar

from http_request import Seen

__all__ = ["FakeServer"]

R = TypeVar("R")  # a provider's scripted reply
Json = dict[str, Any]


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    failures: list[str]

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, ConnectionError):  # a client that hung up is the client's business
            self.failures.append(repr(error))


class FakeServer(Generic[R]):
    """Use as a context manager, then point the client at the server's URL. `add` queues more
    replies at any time; `requests`, `unmatched` and `refused` are safe to read once the client
    is done."""

    def __init__(self, replies: Iterable[R], handler: Callable[[Any], type[BaseHTTPRequestHandler]], name: str) -> None:
        self._lock = threading.Lock()
        self._replies: list[R] = list(replies)
        self.requests: list[Seen] = []
        self.unmatched: list[Seen] = []
        self.refused: list[tuple[Seen, str]] = []  # requests the provider would refuse, with the reason
        self.failures: list[str] = []  # the server's own errors (a client hanging up is none)
        self.holding = threading.Event()  # set once a reply holds its stream open
        self._held: set[socket.socket] = set()
        self._httpd = _HTTPServer(("127.0.0.1", 0), handler(self))
        self._httpd.failures = self.failures
        # `shutdown` waits for the serving loop to notice, which polls at this interval.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name=name, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def pending(self) -> list[R]:
        """Replies not used yet."""
        with self._lock:
            return list(self._replies)

    def add(self, *replies: R) -> None:
        with self._lock:
            self._replies.extend(replies)

    def bodies(self) -> list[Json]:
        """The JSON bodies of the requests, in arrival order."""
        with self._lock:
            return [seen.json() for seen in self.requests]

    def leftovers(self) -> dict[str, list[Any]]:
        """What a test that scripted every request expects to be empty, by kind: replies not
        used, requests no reply matched, requests the provider would refuse, the server's own
        errors."""
        with self._lock:
            found = {
                "pending": list(self._replies),
                "unmatched": [seen.json() for seen in self.unmatched],
                "refused": [problem for _seen, problem in self.refused],
                "failures": list(self.failures),
            }
        return {kind: items for kind, items in found.items() if items}

    def _hold(self, sock: socket.socket, on: bool) -> None:
        with self._lock:
            (self._held.add if on else self._held.discard)(sock)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        with self._lock:
            held = list(self._held)
        for sock in held:  # a held stream's thread is waiting on the client: end it
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # it left meanwhile
        self._httpd.server_close()
        self._thread.join()
