"""`subagents serve` and `subagents hosts`: the serving host and the operator's view of the hosts
sharing a PostgreSQL store (SPEC §9; runtime/hosts/serve.py).

- `serve --store URL [--capacity N]` opens a runtime on the store, announces this process as a
  serving host and runs placed background children — at most N at once — until Ctrl-C. Its
  stdout says `serving host <id> (capacity N) on <store>` once it serves, then one line per child
  it takes (`claimed <id>`) and lets go (`finished <id>`).
- `hosts --store URL [--json]` lists the hosts the store knows: id, started, capacity, sessions
  held (unexpired leases), last renewal (times in UTC, ISO 8601), and whether it is alive.
  Read-only: the rows of hosts gone longer than `[store] forget_hosts_after` (a day) are
  deleted by a serving host's sweep.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING

from subagents.storage import HostRow, StorageError

from ...foundation.errors import CommandFailed, UsageError
from .common import Interrupt, Parser

if TYPE_CHECKING:
    from ...foundation.json_values import JsonObject
    from ..serve import ServeStats
    from ..setup import HostSetup
    from .common import Commands

__all__ = ["add_serve_commands", "hosts_command", "serve_command"]


def add_serve_commands(commands: Commands, root: Parser, model_options: Parser) -> None:
    serve = commands.add_parser(
        "serve",
        parents=[root, model_options],
        help="run the background children other hosts leave to the placement queue (PostgreSQL store)",
    )
    serve.add_argument("--capacity", type=_capacity, default=4, help="children run at once (default 4)")
    hosts = commands.add_parser("hosts", parents=[root], help="the hosts sharing a PostgreSQL store (read-only)")
    hosts.add_argument("--json", action="store_true", help="one JSON document")


def _capacity(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("at least 1")
    return value


def _pg_store(args: argparse.Namespace) -> str:
    from ...store_select import is_pg_url

    spec = args.store
    if spec is None or not is_pg_url(spec):
        raise UsageError(f"{args.command} needs a PostgreSQL store: --store postgresql://...")
    return spec


async def serve_command(args: argparse.Namespace, setup: HostSetup, *, interrupt: Interrupt) -> int:
    """`serve`: until Ctrl-C (status 130 after a clean drain)."""
    import trio

    from ...app import open_runtime
    from ...store_select import store_label
    from ..serve import DEFAULT_SWEEP_INTERVAL, serve_placements
    from ..setup import headless_approver

    url = _pg_store(args)
    options = {**setup.runtime_options(), "approver": headless_approver}
    async with open_runtime(args.root, model=setup.model, store=url, **options) as runtime:
        placements = runtime.subagents.placements
        if placements is None:
            raise UsageError("this store has no placement queue")

        def report(what: str, child_id: str) -> None:
            print(f"{what} {child_id}", flush=True)

        # Sweep as often as leases are renewed: a dead host's work is taken within a ttl and a sweep.
        sweep = getattr(runtime.log_store, "lease_renew_interval", None) or DEFAULT_SWEEP_INTERVAL

        async def serving(task_status: trio.TaskStatus[ServeStats]) -> None:
            await serve_placements(
                runtime.subagents,
                placements,
                args.capacity,
                on_event=report,
                sweep_interval=sweep,
                forget_hosts_after=setup.config.forget_hosts_after,
                task_status=task_status,
            )

        # Until Ctrl-C; the runtime then closes as every host's does (its children drained).
        with interrupt.cancels(on=1):
            async with trio.open_nursery() as nursery:
                await nursery.start(serving)
                label = store_label(runtime.log_store)
                print(f"serving host {placements.host_id} (capacity {args.capacity}) on {label}", flush=True)
    return 130


def hosts_command(args: argparse.Namespace) -> int:
    """`hosts`: one row per host the store knows (read-only)."""
    from ...store_select import open_log_store

    url = _pg_store(args)
    try:
        store = open_log_store(url, create_schema=False)
        try:
            leased = store.leased
            assert leased is not None  # a PostgreSQL store (checked above)
            rows = leased.placements().hosts()
        finally:
            store.close_store()
    except StorageError as exc:
        raise CommandFailed(str(exc)) from None
    if args.json:
        print(json.dumps({"hosts": [_row_json(row) for row in rows]}, ensure_ascii=False))
        return 0
    if not rows:
        print("no hosts")
        return 0
    print(f"{'HOST':<28} {'STARTED':<24} {'CAPACITY':>8} {'HELD':>5}  {'RENEWED':<24} STATE")
    for row in rows:
        started, renewed = _iso(row.started_at or None) or "-", _iso(row.renewed_at) or "never"
        state = "alive" if row.alive else "gone"
        print(f"{row.host_id:<28} {started:<24} {row.capacity:>8} {row.sessions_held:>5}  {renewed:<24} {state}")
    return 0


def _iso(ms: int | None) -> str | None:
    """An epoch-ms time of the database clock as UTC ISO 8601 (`2026-01-02T03:04:05.678Z`): the
    same on every machine, whatever its time zone."""
    if ms is None:
        return None
    seconds, millis = divmod(ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def _row_json(row: HostRow) -> JsonObject:
    return {
        "host_id": row.host_id,
        "started_at": _iso(row.started_at or None),
        "capacity": row.capacity,
        "sessions_held": row.sessions_held,
        "renewed_at": _iso(row.renewed_at),
        "pid": row.pid,
        "hostname": row.hostname,
        "alive": row.alive,
    }
