"""Which log store a runtime or a command uses (SPEC §9; README, "PostgreSQL").

A store is named by one string: a `postgresql://` (or `postgres://`) URL selects the PostgreSQL
store, anything else is a folder for the file store. Another `scheme://` is refused rather than
taken for a folder named like a URL. psycopg is imported only when a URL selects PostgreSQL (by
the store itself), so the file store's commands start as fast as before.

The mailbox follows the log store (`open_mailbox`): rows of the same database on PostgreSQL
(sharing the log store's connections), files under the root otherwise — so a delivery made by
any host that reaches the database reaches the session's owner, wherever it runs.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from subagents.storage import (
    FileLogStore,
    FileMailbox,
    InvalidStoreUrl,
    LogStore,
    Mailbox,
    PostgresLogStore,
    PostgresMailbox,
    ProjectionRegistry,
)

__all__ = ["PG_SCHEMES", "StoreOptions", "is_pg_url", "open_log_store", "open_mailbox", "store_label"]

PG_SCHEMES = ("postgresql", "postgres")


class StoreOptions(TypedDict, total=False):
    """What `open_runtime` passes on to `open_log_store` besides the store (None: its default)."""

    lease_ttl: float | None
    lease_renew_interval: float | None


class _LeaseOptions(TypedDict, total=False):
    """The lease timing a PostgreSQL store is given (absent: its default)."""

    lease_ttl: float
    lease_renew_interval: float


def is_pg_url(spec: str) -> bool:
    """`spec` names a PostgreSQL store; `InvalidStoreUrl` for a URL of any other scheme."""
    scheme, sep, _ = spec.partition("://")
    if not sep:
        return False
    if scheme.lower() in PG_SCHEMES:
        return True
    if scheme.replace("+", "").replace("-", "").replace(".", "").isalnum():
        raise InvalidStoreUrl(f"unsupported store URL scheme {scheme!r} (postgresql://... or a folder)")
    return False


def open_log_store(
    spec: str,
    *,
    compression: Literal["zstd", "none"] = "zstd",
    lease_ttl: float | None = None,
    lease_renew_interval: float | None = None,
    create_schema: bool = True,
    projections: ProjectionRegistry | None = None,
) -> LogStore:
    """The log store `spec` names, opened (the caller closes it with `close_store()`). A
    PostgreSQL URL connects and creates or migrates the schema here (only checks it without
    `create_schema`: `StoreNotInitialized` when missing or older): a malformed URL raises
    `InvalidStoreUrl`, a refused connection `StoreUnreachable`, a newer schema `UnsupportedLog`.
    The lease options go to a PostgreSQL store (the file store has flocks); `projections` to a
    file store, whose index then writes a log's checkpoint rows as it scans it (issue 28 item 1)."""
    if is_pg_url(spec):
        leases: _LeaseOptions = {} if lease_ttl is None else {"lease_ttl": lease_ttl}
        if lease_renew_interval is not None:
            leases["lease_renew_interval"] = lease_renew_interval
        return PostgresLogStore(spec, create_schema=create_schema, **leases)
    return FileLogStore(spec, compression=compression, projections=projections)


def open_mailbox(store: LogStore, root: str) -> Mailbox:
    """The mailbox that goes with `store`: a `PostgresMailbox` on the PostgreSQL store's own
    connection pool (closing the store closes it), else a `FileMailbox` under `root`."""
    if isinstance(store, PostgresLogStore):
        return PostgresMailbox(pool=store.pool)
    return FileMailbox(root)


def store_label(store: LogStore) -> str:
    """How a message names a store: its folder, or its URL without its secrets."""
    if isinstance(store, PostgresLogStore):
        return _redacted(store.url)
    return str(getattr(store, "root", store))


def _redacted(url: str) -> str:
    from subagents.storage import redact_url

    return redact_url(url)
