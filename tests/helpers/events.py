"""Events for logs that tests build, append or fold: turn starts and ends and the seed marker,
made by the store's own `make_event`."""

from __future__ import annotations

from subagents.storage import Batch, Event, Offset, make_event


def turn_start_event(seq: int, time: int, turn: int = 1) -> Event:
    """A `turn/start` of turn `turn`."""
    return make_event(seq, "turn/start", time, {"turn": turn})


def turn_end_event(seq: int, time: int, turn: int = 1) -> Event:
    """A `turn/end` of turn `turn` that completed."""
    return make_event(seq, "turn/end", time, {"turn": turn, "reason": {"kind": "completed"}})


def seed_marker(seq: int, time: int) -> Event:
    """The `session/end-seed` marker a fork writes after the inherited events."""
    return make_event(seq, "session/end-seed", time, {"inherited": True})


def assistant_event(
    seq: int, time: int, turn: int = 1, text: str = "ok", usage: tuple[int, int] | None = None, step: int = 1
) -> Event:
    """An `assistant/message` of turn `turn` saying `text`, with `usage` (input, output) if given."""
    data: dict[str, object] = {
        "turn": turn,
        "step": step,
        "message": {
            "id": f"m{seq}",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "source": {"kind": "model"},
        },
        "finish": "stop",
    }
    if usage is not None:
        data["usage"] = {"input_tokens": usage[0], "output_tokens": usage[1]}
    return make_event(seq, "assistant/message", time, data, surface_op="append")


def turn_starts(start: int, stop: int) -> list[Event]:
    """`turn/start` events for seqs `start` .. `stop - 1`, each at the fixed epoch plus its seq."""
    from clocks import T

    return [turn_start_event(seq, T + seq) for seq in range(start, stop)]


def turn_batch(start: int, stop: int) -> Batch:
    """`turn_starts(start, stop)` as one batch."""
    return Batch(Offset(start), turn_starts(start, stop))
