"""`subagents web`: the web console (SPEC §7; issue 31; runtime/hosts/web/). Its parser and
what it checks before anything is served: the extra is installed, the store is a root, and a
console bound to a non-loopback address has a token from `--token-file`."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import trio

from ...foundation.errors import UsageError
from .common import Interrupt, Parser, read_only_store, until_interrupted

if TYPE_CHECKING:
    from .common import Commands

__all__ = ["add_web_command", "web_main"]

DEFAULT_PORT = 8765


def add_web_command(commands: Commands, root: Parser) -> None:
    web = commands.add_parser(
        "web",
        parents=[root],
        help="serve the web console: sessions, trees and transcripts, live, with send/interrupt/stop",
    )
    web.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1: this machine only)")
    web.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help=f"the port (default {DEFAULT_PORT}; 0: any free one)"
    )
    web.add_argument("--read-only", action="store_true", help="no controls: nothing is sent to any session")
    web.add_argument(
        "--token-file",
        metavar="F",
        default=None,
        help="the access token (first line of F); without it a token is made and printed. Required off loopback",
    )


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("a port is 0..65535")
    return value


def web_main(args: argparse.Namespace) -> int:
    read_only_store(args)
    try:
        from ..web.security import Access, is_loopback, read_token_file
        from ..web.serve import serve_console
    except ImportError as exc:
        raise UsageError(f"subagents web needs the `web` extra (pip install 'trio-subagents[web]'): {exc}") from None
    from ...delegation.listing_stall import configured_stall_after

    if args.token_file is not None:
        access = Access(read_token_file(args.token_file))
    elif not is_loopback(args.host):
        raise UsageError(f"--host {args.host} is not a loopback address: give the access token with --token-file")
    else:
        access = Access.generate()
    stall_after = configured_stall_after()

    def ready(urls: list[str]) -> None:
        store = args.store or args.root
        print(f"subagents web: serving {store} at {', '.join(urls)}{' (read-only)' if args.read_only else ''}")
        if args.token_file is None and not args.read_only:
            print(f"access token: {access.token}")
        sys.stdout.flush()

    async def serve(*, interrupt: Interrupt) -> int:
        with interrupt.cancels():
            await serve_console(
                root=args.root,
                store=args.store,
                host=args.host,
                port=args.port,
                access=access,
                read_only=args.read_only,
                stall_after=stall_after,
                ready=ready,
            )
        return 0

    return trio.run(until_interrupted, serve)
