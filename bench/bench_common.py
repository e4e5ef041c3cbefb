"""Helpers the benchmark scripts share (imported by `bench/*.py` run as scripts)."""

from __future__ import annotations

import os
import statistics

import trio

__all__ = ["BareRequest", "bare_actor", "bare_ask", "bug", "load", "per_rep", "quartiles", "spread"]


def bug(what: str) -> SystemExit:
    """A benchmark that measured the wrong thing must stop, not print a figure."""
    return SystemExit(f"bench bug: {what}")


def per_rep(over: list[float], under: list[float]) -> list[float]:
    return [o / u for o, u in zip(over, under, strict=True)]


def spread(ratios: list[float]) -> str:
    return f"{min(ratios):.2f}..{max(ratios):.2f}"


def quartiles(ratios: list[float]) -> str:
    """The middle half of many ratios (their spread says little once there are dozens)."""
    if len(ratios) < 4:
        return spread(ratios)
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return f"quartiles {q1:.2f}..{q3:.2f}"


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


class BareRequest:
    """A request with a `trio.Event` reply slot, and nothing else: the baseline ask."""

    __slots__ = ("done", "value")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.value: object = None


async def bare_actor(
    receive: trio.MemoryReceiveChannel[BareRequest],
    value: object,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A minimal actor: answers every request with `value`."""
    task_status.started()
    async for request in receive:
        request.value = value
        request.done.set()


async def bare_ask(send: trio.MemorySendChannel[BareRequest]) -> object:
    request = BareRequest()
    await send.send(request)
    await request.done.wait()
    return request.value
