"""Mailbox envelopes: the value, its delivery ids (ULIDs) and its one-line JSON form.

An envelope is what one process leaves in another session's mailbox (SPEC §9; docs/format.md,
"The mailbox"): `{delivery_id, kind, sender, body, created_at}`. The delivery id is a ULID
(26 characters of Crockford base32: 48 bits of milliseconds, then 80 random bits), so the
names of the mailbox's files sort in delivery order. Within one `DeliveryIds` (one per mailbox
instance, so per sending process) ids are strictly increasing even when the clock stands still
or steps back: the next id is the last one plus one. Across processes, ids order by each
sender's clock; ties are broken by the random part.

Decoding is strict (msgspec: no `"5"`, `true` or `5.9` for an int, no unknown or missing keys),
and every check a reader makes is also made when an envelope is built, so a mailbox never
holds an envelope its owner would refuse.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Literal

import msgspec

from ._codec import check_lossless
from .errors import InvalidDeliveryId, InvalidEnvelope, NonLosslessData
from .events import DELIVERY_ID_PATTERN

__all__ = [
    "ENVELOPE_KINDS",
    "MAX_ENVELOPE_BYTES",
    "DeliveryIds",
    "Envelope",
    "EnvelopeKind",
    "check_delivery_id",
    "decode_envelope",
    "encode_envelope",
    "new_delivery_id",
]

EnvelopeKind = Literal["message", "interrupt", "stop", "settled"]
ENVELOPE_KINDS: frozenset[str] = frozenset({"message", "interrupt", "stop", "settled"})
MAX_ENVELOPE_BYTES = 16 << 20  # an envelope file larger than this is refused unread

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_DIGIT = {ch: value for value, ch in enumerate(_CROCKFORD)}
# 26 characters hold 130 bits, so a 128-bit ULID starts with 0-7. Only the canonical upper-case
# spelling is accepted: one id, one file name (and the same rule for the id a user/message records).
ULID_PATTERN = DELIVERY_ID_PATTERN
_MAX_MS = (1 << 48) - 1
_INT64_MAX = (1 << 63) - 1

RandomBytes = Callable[[int], bytes]


def check_delivery_id(value: object) -> str:
    """Return `value` if it is a canonical ULID string, else raise `InvalidDeliveryId`."""
    if type(value) is not str or not ULID_PATTERN.fullmatch(value):
        raise InvalidDeliveryId(f"delivery id must be a 26-character upper-case ULID, got {value!r}")
    return value


def _ulid_int(ulid: str) -> int:
    value = 0
    for ch in ulid:
        value = value * 32 + _DIGIT[ch]
    return value


def _ulid_str(value: int) -> str:
    chars: list[str] = []
    for _ in range(26):
        value, digit = divmod(value, 32)
        chars.append(_CROCKFORD[digit])
    return "".join(reversed(chars))


def delivery_id_ms(delivery_id: str) -> int:
    """The milliseconds part of a delivery id."""
    return _ulid_int(check_delivery_id(delivery_id)) >> 80


def new_delivery_id(now_ms: int, random: RandomBytes = os.urandom, previous: str | None = None) -> str:
    """A ULID for time `now_ms` (epoch ms) with 80 bits from `random(10)`.

    With `previous` (the last id this maker returned), the result sorts after it: when `now_ms`
    is not later than `previous`'s time, it is `previous + 1` (same millisecond, random part
    incremented; a carry moves it into the next millisecond). Pure: the state lives in the
    caller (`DeliveryIds`).
    """
    if type(now_ms) is not int or not 0 <= now_ms <= _MAX_MS:
        raise InvalidDeliveryId(f"a delivery id's time must be an int in [0, 2^48), got {now_ms!r}")
    if previous is not None:
        last = _ulid_int(check_delivery_id(previous))
        if now_ms <= last >> 80:
            if last + 1 >> 128:
                raise InvalidDeliveryId("no delivery id sorts after the largest ULID")
            return _ulid_str(last + 1)
    noise = random(10)
    if type(noise) is not bytes or len(noise) != 10:
        raise InvalidDeliveryId("random(10) must return 10 bytes")
    return _ulid_str(now_ms << 80 | int.from_bytes(noise, "big"))


class DeliveryIds:
    """A thread-safe maker of strictly increasing delivery ids (one per mailbox instance)."""

    def __init__(self, random: RandomBytes = os.urandom) -> None:
        self._random = random
        self._last: str | None = None
        self._lock = threading.Lock()

    def next(self, now_ms: int) -> str:
        """The next id: at `now_ms`, or just after the last one if that is not earlier."""
        with self._lock:
            self._last = new_delivery_id(now_ms, self._random, self._last)
            return self._last


class Envelope(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One delivery: `kind` says what the owner does with `body` (a JSON object the runtime
    defines per kind); `sender` is the sending session's id, or None (an operator);
    `created_at` is the sender's clock in epoch ms. Checked when built and when decoded:
    `InvalidEnvelope` says what is wrong."""

    delivery_id: str
    kind: EnvelopeKind
    sender: str | None
    body: dict[str, Any]
    created_at: int

    def __post_init__(self) -> None:
        # msgspec checks types when decoding but not when a Struct is built by hand: check here,
        # so both paths refuse the same envelopes.
        if type(self.delivery_id) is not str or not ULID_PATTERN.fullmatch(self.delivery_id):
            raise InvalidEnvelope(f"delivery_id must be a 26-character upper-case ULID, got {self.delivery_id!r}")
        if self.kind not in ENVELOPE_KINDS or type(self.kind) is not str:
            raise InvalidEnvelope(f"kind must be one of {sorted(ENVELOPE_KINDS)}, got {self.kind!r}")
        if self.sender is not None and type(self.sender) is not str:
            raise InvalidEnvelope(f"sender must be a str or None, got {type(self.sender).__name__}")
        if type(self.body) is not dict:
            raise InvalidEnvelope(f"body must be a JSON object, got {type(self.body).__name__}")
        if type(self.created_at) is not int or not 0 <= self.created_at <= _INT64_MAX:
            raise InvalidEnvelope(f"created_at must be a non-negative int (epoch ms), got {self.created_at!r}")
        try:
            check_lossless(self.sender, "$.sender")
            check_lossless(self.body, "$.body")
        except NonLosslessData as exc:
            raise InvalidEnvelope(f"the envelope is not lossless JSON: {exc.message}") from None

    @classmethod
    def new(
        cls,
        ids: DeliveryIds,
        now_ms: int,
        kind: EnvelopeKind,
        body: dict[str, Any],
        *,
        sender: str | None = None,
    ) -> Envelope:
        """An envelope with the next id of `ids` at `now_ms`, created at `now_ms`."""
        return cls(delivery_id=ids.next(now_ms), kind=kind, sender=sender, body=body, created_at=now_ms)


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Envelope)


def encode_envelope(envelope: Envelope) -> bytes:
    """The envelope's file contents: one JSON object (keys in the documented order) and `\\n`."""
    if type(envelope) is not Envelope:
        raise InvalidEnvelope(f"deliver takes an Envelope, got {type(envelope).__name__}")
    data = _ENCODER.encode(envelope) + b"\n"
    if len(data) > MAX_ENVELOPE_BYTES:
        raise InvalidEnvelope(f"the envelope is {len(data)} bytes; at most {MAX_ENVELOPE_BYTES} are allowed")
    return data


def decode_envelope(data: bytes, name: str) -> Envelope:
    """The envelope stored in the file `name` (`<delivery_id>.json`), or `InvalidEnvelope`
    saying why it cannot be trusted."""
    try:
        envelope = _DECODER.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InvalidEnvelope(f"not a valid envelope: {exc}") from None
    except InvalidEnvelope:
        raise
    if f"{envelope.delivery_id}.json" != name:
        raise InvalidEnvelope(f"holds delivery_id {envelope.delivery_id!r}, which does not match its file name")
    return envelope
