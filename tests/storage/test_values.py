"""Table tests for storage values: session ids, their folder-name encoding, the session header."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from subagents.storage import (
    InvalidSessionId,
    SessionHeader,
    SessionId,
    check_session_id,
    decode_session_id,
    encode_session_id,
)

# Any character a valid id may hold: no Cc (controls), no Cs (surrogates cannot be UTF-8 encoded).
ID_CHARS = st.characters(blacklist_categories=("Cc", "Cs"))
# Bias towards the bytes the encoding treats specially.
TRICKY_CHARS = st.sampled_from(list("./~-_aZ9 %:\\é日😀\u2028\u00a0"))


def _fits(s: str) -> bool:
    return len(s.encode("utf-8")) <= 80


valid_ids = st.one_of(
    st.text(ID_CHARS, min_size=1, max_size=20),
    st.text(TRICKY_CHARS, min_size=1, max_size=80),
    st.text(st.sampled_from(list("ab.~/")), min_size=1, max_size=80),
).filter(_fits)


# --- check_session_id ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("a", id="one-char"),
        pytest.param("x" * 80, id="80-ascii-bytes"),
        pytest.param("é" * 40, id="80-bytes-of-2-byte-chars"),
        pytest.param("日" * 26 + "ab", id="80-bytes-of-3-byte-chars"),
        pytest.param("😀" * 20, id="80-bytes-of-4-byte-chars"),
        pytest.param("a/b", id="slash"),
        pytest.param("..", id="dotdot"),
        pytest.param(".", id="dot"),
        pytest.param("~", id="tilde"),
        pytest.param(" ", id="space"),
        pytest.param("\u2028", id="line-separator-is-Zl-not-Cc"),
        pytest.param("\u00a0", id="nbsp"),
        pytest.param("\u200b", id="zero-width-space-is-Cf"),
    ],
)
def test_valid_session_ids_are_accepted_unchanged(value: str) -> None:
    assert check_session_id(value) == value


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("", id="empty"),
        pytest.param("x" * 81, id="81-ascii-bytes"),
        pytest.param("é" * 40 + "x", id="81-bytes-multibyte"),
        pytest.param("x" * 79 + "é", id="80-chars-81-bytes"),
        pytest.param("😀" * 20 + "x", id="81-bytes-4-byte-chars"),
        pytest.param("a\ud800b", id="lone-high-surrogate"),
        pytest.param("\udc00", id="lone-low-surrogate"),
        pytest.param("a\x00b", id="nul"),
        pytest.param("a\nb", id="newline"),
        pytest.param("\r", id="carriage-return"),
        pytest.param("\t", id="tab"),
        pytest.param("a\x1bb", id="escape"),
        pytest.param("\x7f", id="del"),
        pytest.param("a\x85", id="nel-c1-control"),
        pytest.param("\x9f", id="c1-control-last"),
    ],
)
def test_invalid_session_ids_are_refused(value: str) -> None:
    with pytest.raises(InvalidSessionId) as info:
        check_session_id(value)
    assert info.value.code == "STORAGE_INVALID_SESSION_ID"
    assert "session id" in str(info.value)


@pytest.mark.parametrize(
    "value",
    [None, 5, b"abc", bytearray(b"abc"), ["a"], pytest.param(SessionId, id="class")],
)
def test_non_str_session_ids_are_refused(value: object) -> None:
    with pytest.raises(InvalidSessionId) as info:
        check_session_id(value)
    assert info.value.code == "STORAGE_INVALID_SESSION_ID"


def test_str_subclass_is_refused() -> None:
    class Sneaky(str):
        pass

    with pytest.raises(InvalidSessionId):
        check_session_id(Sneaky("abc"))


def test_invalid_session_id_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        check_session_id("")


# --- encode_session_id --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("session_id", "encoded"),
    [
        ("abc", "abc"),
        ("A-Z_a-z_0-9", "A-Z_a-z_0-9"),
        ("a/b", "a~2Fb"),
        ("/", "~2F"),
        ("../x", "~2E.~2Fx"),
        ("..", "~2E."),
        (".", "~2E"),
        (".x", "~2Ex"),
        ("x.y", "x.y"),
        ("x.", "x."),
        ("x..", "x.."),
        ("~", "~7E"),
        ("a~b", "a~7Eb"),
        ("~2F", "~7E2F"),
        (" ", "~20"),
        ("a b", "a~20b"),
        ("%", "~25"),
        (":", "~3A"),
        ("\\", "~5C"),
        ("+", "~2B"),
        ("é", "~C3~A9"),
        ("日", "~E6~97~A5"),
        ("😀", "~F0~9F~98~80"),
        ("\u2028", "~E2~80~A8"),
    ],
)
def test_encoding_table(session_id: str, encoded: str) -> None:
    assert encode_session_id(session_id) == encoded
    assert decode_session_id(encoded) == session_id


def test_encoding_uses_uppercase_hex() -> None:
    assert encode_session_id("\u00ff\u00ab") == "~C3~BF~C2~AB"  # bytes C3 BF C2 AB
    assert encode_session_id("\u00da") == "~C3~9A"


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("a\x00b", id="nul"),
        pytest.param("", id="empty"),
        pytest.param("x" * 81, id="81-bytes"),
        pytest.param("\ud800", id="lone-surrogate"),
        pytest.param("a\nb", id="newline"),
    ],
)
def test_encoding_refuses_invalid_ids(value: str) -> None:
    with pytest.raises(InvalidSessionId):
        encode_session_id(value)


@pytest.mark.parametrize(
    "session_id",
    [
        pytest.param("x" * 80, id="ascii"),
        pytest.param("~" * 80, id="all-escaped-ascii"),
        pytest.param("." * 80, id="all-dots"),
        pytest.param("é" * 40, id="2-byte"),
        pytest.param("😀" * 20, id="4-byte"),
        pytest.param("/" * 80, id="all-slashes"),
    ],
)
def test_a_full_80_byte_id_encodes_to_at_most_240_chars(session_id: str) -> None:
    encoded = encode_session_id(session_id)
    assert len(encoded) <= 240
    assert decode_session_id(encoded) == session_id


def test_worst_case_encoding_is_exactly_240_chars() -> None:
    assert len(encode_session_id("~" * 80)) == 240


# --- decode_session_id --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "session_id"),
    [
        ("abc", "abc"),
        ("~2Fb", "/b"),
        ("a~2Fb", "a/b"),
        ("~2E", "."),
        ("~2E.", ".."),
        ("~2Ex", ".x"),
        ("x.y", "x.y"),
        ("~7E", "~"),
        ("~C3~A9", "é"),
    ],
)
def test_decoding_canonical_names(name: str, session_id: str) -> None:
    assert decode_session_id(name) == session_id


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("", id="empty"),
        pytest.param(".", id="dot"),
        pytest.param("..", id="dotdot"),
        pytest.param(".x", id="leading-dot-literal"),
        pytest.param("a~2fb", id="lowercase-hex"),
        pytest.param("~c3~a9", id="lowercase-hex-multibyte"),
        pytest.param("~C3~a9", id="mixed-case-hex"),
        pytest.param("~61", id="escaped-safe-letter"),
        pytest.param("~5F", id="escaped-underscore"),
        pytest.param("~2D", id="escaped-dash"),
        pytest.param("x~2Ey", id="escaped-dot-not-first"),
        pytest.param("~", id="dangling-tilde"),
        pytest.param("a~", id="dangling-tilde-at-end"),
        pytest.param("a~2", id="dangling-one-hex-digit"),
        pytest.param("~GG", id="not-hex"),
        pytest.param("~+1", id="signed-hex"),
        pytest.param("~-1", id="negative-hex"),
        pytest.param("~ 1", id="space-in-hex"),
        pytest.param("a b", id="literal-space"),
        pytest.param("a%2Fb", id="percent-escape"),
        pytest.param("é", id="literal-non-ascii"),
        pytest.param("a:b", id="literal-colon"),
        pytest.param("~00", id="decodes-to-nul"),
        pytest.param("a~0Ab", id="decodes-to-newline"),
        pytest.param("~7F", id="decodes-to-del"),
        pytest.param("~C2~85", id="decodes-to-nel"),
        pytest.param("~C3", id="truncated-utf8"),
        pytest.param("~FF", id="invalid-utf8-byte"),
        pytest.param("~ED~A0~80", id="encoded-surrogate"),
        pytest.param("x" * 81, id="81-bytes"),
        pytest.param("~C3~A9" * 40 + "x", id="81-bytes-multibyte"),
        pytest.param("a~7e", id="lowercase-tilde"),
    ],
)
def test_decoding_refuses_non_canonical_names(name: str) -> None:
    assert decode_session_id(name) is None


@given(valid_ids)
@example("..")
@example(".")
@example("~")
@example("/")
@example("x" * 80)
@example("😀" * 20)
def test_encoding_round_trips_and_stays_inside_its_folder(session_id: str) -> None:
    encoded = encode_session_id(session_id)
    assert decode_session_id(encoded) == session_id
    assert "/" not in encoded
    assert "\x00" not in encoded
    assert encoded not in (".", "..")
    assert not encoded.startswith(".")
    assert 0 < len(encoded) <= 240
    assert encoded.isascii()


@given(st.text(st.sampled_from(list("~0123456789ABCDEFabcdef.x/é")), max_size=12))
def test_decoding_accepts_only_canonical_encodings(name: str) -> None:
    sid = decode_session_id(name)
    if sid is not None:
        assert check_session_id(sid) == sid
        assert encode_session_id(sid) == name


# --- SessionHeader ------------------------------------------------------------------------------


def test_minimal_header_defaults() -> None:
    header = SessionHeader(id=SessionId("s"), created_at=0)
    assert header.format == 1
    assert header.is_seeded is False
    assert header.delegation_depth == 0
    assert header.cwd is None
    assert header.parent_session is None
    assert header.origin is None
    assert header.agent_preset is None


def test_full_header_is_accepted() -> None:
    header = SessionHeader(
        id=SessionId("child"),
        created_at=1789000000000,
        is_seeded=True,
        delegation_depth=2,
        cwd="/home/user/project",
        parent_session=SessionId("parent"),
        origin="subagent",
        agent_preset="researcher",
    )
    assert header.origin == "subagent"
    assert header.cwd == "/home/user/project"


def test_header_is_frozen() -> None:
    header = SessionHeader(id=SessionId("s"), created_at=0)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        header.created_at = 5  # type: ignore[misc]  # assigning to a frozen field: the refusal under test


def test_header_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        SessionHeader("s", 0)  # type: ignore[misc]  # positional arguments: the refusal under test


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"created_at": -1}, id="negative-created-at"),
        pytest.param({"delegation_depth": -1}, id="negative-depth"),
        pytest.param({"cwd": "relative/path"}, id="relative-cwd"),
        pytest.param({"cwd": ""}, id="empty-cwd"),
        pytest.param({"cwd": "./here"}, id="dot-relative-cwd"),
        pytest.param({"origin": "user"}, id="bad-origin"),
        pytest.param({"origin": "Subagent"}, id="origin-wrong-case"),
        pytest.param({"origin": ""}, id="empty-origin"),
        pytest.param({"parent_session": ""}, id="empty-parent"),
        pytest.param({"parent_session": "a\nb"}, id="control-char-parent"),
        pytest.param({"parent_session": "x" * 81}, id="long-parent"),
        pytest.param({"id": ""}, id="empty-id"),
        pytest.param({"id": "a\x00"}, id="nul-id"),
        # The header is written as JSON line 1: a str that cannot be UTF-8 encoded must be
        # refused here, before a store tries to publish it.
        pytest.param({"cwd": "/\ud800"}, id="lone-surrogate-cwd"),
        pytest.param({"agent_preset": "\udfff"}, id="lone-surrogate-preset"),
    ],
)
def test_invalid_header_values_are_refused(changes: dict[str, object]) -> None:
    fields: dict[str, object] = {"id": "s", "created_at": 1789000000000, **changes}
    with pytest.raises(ValueError):
        SessionHeader(**fields)  # type: ignore[arg-type]  # deliberately wrong field types: the refusal under test


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"created_at": True}, id="bool-created-at"),
        pytest.param({"created_at": 1.5}, id="float-created-at"),
        pytest.param({"created_at": "5"}, id="str-created-at"),
        pytest.param({"delegation_depth": False}, id="bool-depth"),
        pytest.param({"delegation_depth": 1.0}, id="float-depth"),
        pytest.param({"cwd": b"/bytes"}, id="bytes-cwd"),
        pytest.param({"id": 5}, id="int-id"),
        pytest.param({"agent_preset": 5}, id="int-preset"),
        # The strict header reader refuses a non-bool is_seeded, so a store that accepted one
        # would publish a log that it reads back as corrupt.
        pytest.param({"is_seeded": 1}, id="int-is-seeded"),
        pytest.param({"is_seeded": "yes"}, id="str-is-seeded"),
        pytest.param({"is_seeded": None}, id="none-is-seeded"),
    ],
)
def test_header_fields_of_the_wrong_type_are_refused(changes: dict[str, object]) -> None:
    fields: dict[str, object] = {"id": "s", "created_at": 1789000000000, **changes}
    with pytest.raises((TypeError, ValueError)):
        SessionHeader(**fields)  # type: ignore[arg-type]  # deliberately wrong field types: the refusal under test


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"id": "a/b"}, id="slash-id"),
        pytest.param({"parent_session": ".."}, id="dotdot-parent"),
    ],
)
def test_header_accepts_valid_ids_with_awkward_characters(changes: dict[str, object]) -> None:
    fields: dict[str, object] = {"id": "s", "created_at": 0, **changes}
    # Valid ids with awkward characters are accepted: the encoding makes them safe.
    SessionHeader(**fields)  # type: ignore[arg-type]  # fields from the test table


@pytest.mark.parametrize("field", ["id", "parent_session"])
def test_header_refuses_invalid_ids_with_invalid_session_id(field: str) -> None:
    fields: dict[str, object] = {"id": "s", "created_at": 0, field: "bad\x7f"}
    with pytest.raises(InvalidSessionId):
        SessionHeader(**fields)  # type: ignore[arg-type]  # deliberately wrong field types: the refusal under test
