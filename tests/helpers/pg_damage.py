"""Damage planted in a PostgreSQL store's rows by hand, the way tests damage a log file by editing
it: so the damaged-listing and restore expectations (diagnostic rows, never a crash, never a
vanished child, checkpoints never trusted blindly) are checked on PostgreSQL too.

Every function opens its own connection to the store's database (`url`), as another client
would, and changes rows behind the store's back: a log's bytes rewritten (`rewrite`: line 1 and
every event line, the way a file is edited), a header row torn or garbled, a batch row garbled,
removed (a seq gap) or given a bad zstd frame, a session's rows deleted or copied under another
id, checkpoint rows garbled or moved. A listing row's revision is the plain form's byte size and
the row's generation; edits keep the generation (an edit in place) and set the byte size to
the edited bytes', as a file's size follows an edit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zstandard

__all__ = [
    "TABLES",
    "batches",
    "checkpoint_rows",
    "copy_session",
    "delete_session",
    "drop_batch",
    "garble_batch",
    "garble_checkpoints",
    "plain_log",
    "restore_rows",
    "rewrite",
    "save_rows",
    "set_checkpoint_offsets",
    "sql",
    "tear_header",
    "zstd_batch",
]


def sql(url: str, statement: str, params: Any = ()) -> list[tuple[Any, ...]]:
    """Run one statement on a connection of its own; its rows (none for a statement without)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description is not None else []


def _lines(data: bytes, compressed: bool) -> bytes:
    return zstandard.ZstdDecompressor().decompress(data) if compressed else data


def batches(url: str, sid: str) -> list[tuple[int, int, bytes, bool]]:
    """The session's batch rows in seq order: (first_seq, count, data as stored, compressed)."""
    rows = sql(
        url, "SELECT first_seq, count, data, compressed FROM batches WHERE session_id = %s ORDER BY first_seq", (sid,)
    )
    return [(first, count, bytes(data), compressed) for first, count, data, compressed in rows]


def plain_log(url: str, sid: str) -> bytes:
    """The session as its plain format 1 file would hold it: line 1, then every event line."""
    ((header,),) = sql(url, "SELECT header FROM sessions WHERE id = %s", (sid,))
    return bytes(header) + b"".join(_lines(data, z) for _, _, data, z in batches(url, sid))


def rewrite(url: str, sid: str, edit: Callable[[bytes], bytes], *, keep_checkpoints: bool = False) -> None:
    """Replace the session's log by an edited copy of its plain bytes: line 1 becomes the header
    row (whatever it holds, even nothing), the event lines one batch row holding all of them.
    The store's triggers forget the session's checkpoint rows (schema version 4) unless
    `keep_checkpoints` (they are disabled for this transaction: rows that outlived their log)."""
    edited = edit(plain_log(url, sid))
    header, newline, body = edited.partition(b"\n")
    count = body.count(b"\n")
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        if keep_checkpoints:
            conn.execute("SET LOCAL session_replication_role = replica")  # no triggers (a superuser's test server)
        conn.execute("DELETE FROM batches WHERE session_id = %s", (sid,))
        conn.execute(
            "UPDATE sessions SET header = %s, event_count = %s, byte_size = %s WHERE id = %s",
            (header + newline, count, len(edited), sid),
        )
        if count:
            conn.execute(
                "INSERT INTO batches (session_id, first_seq, count, data, compressed) VALUES (%s, 0, %s, %s, false)",
                (sid, count, body),
            )


def tear_header(url: str, sid: str, keep: int) -> None:
    """Cut the header row to its first `keep` bytes (no newline: a torn line 1)."""
    sql(url, "UPDATE sessions SET header = substring(header FROM 1 FOR %s) WHERE id = %s", (keep, sid))


def garble_batch(url: str, sid: str, first_seq: int, data: bytes = b'{"seq":\x00 garbled}\n') -> None:
    """Replace one batch row's lines by `data` (stored plain), its count kept."""
    sql(
        url,
        "UPDATE batches SET data = %s, compressed = false WHERE session_id = %s AND first_seq = %s",
        (data, sid, first_seq),
    )


def drop_batch(url: str, sid: str, first_seq: int) -> None:
    """Delete one batch row: the seqs it held are a gap (the session's count unchanged)."""
    sql(url, "DELETE FROM batches WHERE session_id = %s AND first_seq = %s", (sid, first_seq))


def zstd_batch(url: str, sid: str, first_seq: int, *, damage: bool = True) -> None:
    """Store one batch row as a zstd frame of its own lines; with `damage`, a byte inside the
    frame's compressed block flipped, so its content checksum fails."""
    ((data, compressed),) = sql(
        url, "SELECT data, compressed FROM batches WHERE session_id = %s AND first_seq = %s", (sid, first_seq)
    )
    lines = _lines(bytes(data), compressed)
    frame = bytearray(zstandard.ZstdCompressor(write_checksum=True, write_content_size=True).compress(lines))
    if damage:
        frame[len(frame) // 2] ^= 0x5A
    sql(
        url,
        "UPDATE batches SET data = %s, compressed = true WHERE session_id = %s AND first_seq = %s",
        (bytes(frame), sid, first_seq),
    )


def delete_session(url: str, sid: str) -> None:
    """Every row of the session gone (its checkpoints, batches and header row)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        for table in ("checkpoints", "batches"):
            conn.execute(f"DELETE FROM {table} WHERE session_id = %s", (sid,))
        conn.execute("DELETE FROM sessions WHERE id = %s", (sid,))


def copy_session(url: str, sid: str, copy: str) -> None:
    """The session's header row and batch rows copied under the id `copy` (line 1 still names
    `sid`, as a copied session folder's does); checkpoint rows are not copied."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute(
            "INSERT INTO sessions (id, header, created_at, parent_session, origin, is_seeded, "
            "inherited_event_count, delegation_depth, event_count, last_time, byte_size) "
            "SELECT %s, header, created_at, parent_session, origin, is_seeded, inherited_event_count, "
            "delegation_depth, event_count, last_time, byte_size FROM sessions WHERE id = %s",
            (copy, sid),
        )
        conn.execute(
            "INSERT INTO batches (session_id, first_seq, count, data, compressed, epoch) "
            "SELECT %s, first_seq, count, data, compressed, epoch FROM batches WHERE session_id = %s",
            (copy, sid),
        )


def checkpoint_rows(url: str, sid: str | None = None) -> list[tuple[Any, ...]]:
    """Checkpoint rows (session_id, unit, ver, seq, log_offset, value), of one session or all."""
    rows = sql(
        url,
        "SELECT session_id, unit, ver, seq, log_offset, value FROM checkpoints "
        "WHERE %(sid)s::text IS NULL OR session_id = %(sid)s ORDER BY session_id, unit",
        {"sid": sid},
    )
    return [(*row[:5], bytes(row[5])) for row in rows]


def garble_checkpoints(url: str, sid: str, *, value: bytes | None = None, lifecycle: bytes | None = None) -> None:
    """Overwrite the session's checkpoint rows' value JSON and/or lifecycle record."""
    if value is not None:
        sql(url, "UPDATE checkpoints SET value = %s WHERE session_id = %s", (value, sid))
    if lifecycle is not None:
        sql(url, "UPDATE checkpoints SET lifecycle = %s WHERE session_id = %s", (lifecycle, sid))


def set_checkpoint_offsets(url: str, offset: int, sid: str | None = None) -> None:
    """Point checkpoint rows (one session's, or all) at another log offset (an event count here)."""
    sql(
        url,
        "UPDATE checkpoints SET log_offset = %(offset)s WHERE %(sid)s::text IS NULL OR session_id = %(sid)s",
        {"offset": offset, "sid": sid},
    )


TABLES = ("sessions", "batches", "checkpoints")  # in the order rows may be inserted


def save_rows(url: str, name: str) -> None:
    """Keep a copy of every session, batch and checkpoint row under `name` (tables of their own,
    which the per-test reset leaves alone)."""
    for table in TABLES:
        sql(url, f"DROP TABLE IF EXISTS {name}_{table}")
        sql(url, f"CREATE TABLE {name}_{table} AS SELECT * FROM {table}")


def restore_rows(url: str, name: str) -> None:
    """Replace every session, batch and checkpoint row by the copy `save_rows` kept: the same
    bytes, the same generations, in one transaction."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        for table in reversed(TABLES):
            conn.execute(f"DELETE FROM {table}")
        for table in TABLES:
            conn.execute(f"INSERT INTO {table} SELECT * FROM {name}_{table}")
