"""Exception groups at the edge of a public call: only cancellation may pass, and bare.

Trio nurseries wrap their children's exceptions in groups (strict exception groups); a public
call must never leak one. Calls whose tasks keep every other failure as a value only ever see a
group of `trio.Cancelled` from an enclosing scope, which the enclosing scope expects bare.
"""

from __future__ import annotations

from typing import NoReturn

import trio

__all__ = ["raise_bare_cancelled"]


def raise_bare_cancelled(group: BaseExceptionGroup[BaseException]) -> NoReturn:
    """Re-raise a group of `trio.Cancelled` as one bare `Cancelled`; anything else unchanged."""
    cancelled, rest = group.split(trio.Cancelled)
    if rest is not None or cancelled is None:
        raise group
    leaf: BaseException = cancelled
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    raise leaf from None
