"""How long the PostgreSQL store waits: a connect timeout and a statement timeout on every
connection, so a server that stops answering (down, partitioned, or a backend stuck behind
another session's lock) is an error in bounded time, never a hang.

Both come from the store's URL as libpq reads it, with defaults where it says nothing:
- `connect_timeout` (seconds; `?connect_timeout=5`, or `PGCONNECT_TIMEOUT`): default
  `CONNECT_TIMEOUT`.
- `statement_timeout` (the server setting, in `options`:
  `?options=-c%20statement_timeout%3D5s`, or `PGOPTIONS`): default `STATEMENT_TIMEOUT`. `0`
  turns it off. Other `options` in the URL are kept.

A statement the server cancelled for its timeout (`QueryCanceled`) is `StoreUnreachable` to
callers: the store did not answer in time, as when it cannot be reached (`is_timeout`).
"""

from __future__ import annotations

import os
from typing import Any

from .errors import StoreUnreachable

__all__ = ["CONNECT_TIMEOUT", "STATEMENT_TIMEOUT", "connection_options", "is_timeout", "timed_out"]

CONNECT_TIMEOUT = 10  # seconds
STATEMENT_TIMEOUT = "30s"  # a PostgreSQL duration


def connection_options(url: str) -> dict[str, Any]:
    """The keyword arguments to add to `psycopg.connect(url, ...)`: the defaults for what the
    URL (and libpq's environment) leaves unset. `url` was checked (pg_connect.check_url)."""
    from psycopg import conninfo

    given = conninfo.conninfo_to_dict(url)
    extra: dict[str, Any] = {}
    if "connect_timeout" not in given and not os.environ.get("PGCONNECT_TIMEOUT"):
        extra["connect_timeout"] = CONNECT_TIMEOUT
    options = str(given.get("options") or "")
    if "statement_timeout" not in options and "statement_timeout" not in os.environ.get("PGOPTIONS", ""):
        # Passed as a keyword, `options` replaces the URL's own: keep those in front.
        extra["options"] = f"{options} -c statement_timeout={STATEMENT_TIMEOUT}".strip()
    return extra


def is_timeout(exc: BaseException) -> bool:
    """The server cancelled the statement (its statement timeout, or an operator's cancel)."""
    import psycopg

    return isinstance(exc, psycopg.errors.QueryCanceled)


def timed_out(where: str, what: str, exc: BaseException) -> StoreUnreachable:
    """The error for `what` (`session 'x': list`) cancelled by the server's timeout; `where` is
    the store's URL without its password (pg_connect.redact)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return StoreUnreachable(
        f"{what}: the PostgreSQL store at {where} did not answer in time ({first}; "
        "the statement_timeout in the URL's options sets how long to wait)"
    )
