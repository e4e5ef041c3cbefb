"""Issue 18 item 2: `--store URL` picks the log store — a PostgreSQL URL the PostgreSQL store, a
folder the file store; a bad URL or a refused connection is one line, exit status 2, nothing
written; `subagents demo --store postgresql://...` ends `demo: ok`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from cli_process import CLI, clean_env
from subagents.runtime.app import open_runtime
from subagents.runtime.hosts.cli import main
from subagents.storage import FileLogStore, PostgresLogStore, StoreNotInitialized

EXPECTED_END = ["demo: 3 children settled", "demo: restart", "demo: demo-2 resumed", "demo: ok"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when this returns: connections are refused


@pytest.mark.parametrize(
    ("store", "said"),
    [
        ("postgresql://localhost:notaport/db", "not a valid PostgreSQL URL"),
        ("mysql://localhost/db", "unsupported store URL scheme 'mysql'"),
        (
            "postgresql://127.0.0.1:{port}/db?connect_timeout=2",
            "cannot connect to PostgreSQL at postgresql://127.0.0.1",
        ),
    ],
    ids=["malformed", "other-scheme", "refused"],
)
@pytest.mark.parametrize(
    "command",
    [
        ["sessions"],
        ["show", "s1"],
        ["children", "s1"],
        ["tail", "s1"],
        ["send", "s1", "hello"],
        ["run", "hi", "--model", "scripted:/nonexistent.json"],
        ["demo"],
    ],
    ids=lambda c: c[0],
)
def test_a_bad_store_is_one_line_exit_2_and_nothing_written(
    tmp_path: Path, store: str, said: str, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    url = store.format(port=_closed_port())
    assert main([*command, "--root", str(root), "--store", url]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("subagents: ")
    assert said in captured.err and "Traceback" not in captured.err
    assert not root.exists()


def test_a_store_password_is_never_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"postgresql://me:sekrit@127.0.0.1:{_closed_port()}/db?connect_timeout=2"
    assert main(["sessions", "--store", url]) == 2
    err = capsys.readouterr().err
    assert "sekrit" not in err and "***" in err


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://me:sekrit@h:5432/db", "postgresql://me:***@h:5432/db"),
        ("postgresql:///db?host=/tmp/s&password=sekrit", "postgresql:///db?host=/tmp/s&password=***"),
        (
            "postgres://me@h1:1,h2:2/db?sslpassword=sekrit&sslmode=require&api_token=sekrit",
            "postgres://me@h1:1,h2:2/db?sslpassword=***&sslmode=require&api_token=***",
        ),
        ("postgresql://h/db?PassWord=sekrit&client_secret=sekrit&sslkey=sekrit", None),
        ("postgresql://h/db?pass%77ord=sekrit&passfile=sekrit", None),
        ("postgresql://me:se%40krit@h/db", "postgresql://me:***@h/db"),
        ("postgresql://h/db?application_name=plain", "postgresql://h/db?application_name=plain"),
    ],
)
def test_every_secret_of_a_store_url_is_redacted(url: str, shown: str | None) -> None:
    """Issue 27: a password in a query parameter was printed whole. `redact_url` is what every
    banner, listing and error names a store by."""
    from subagents.storage import redact_url

    redacted = redact_url(url)
    assert "sekrit" not in redacted and "se%40krit" not in redacted
    if shown is not None:
        assert redacted == shown


@pytest.mark.parametrize("command", [["sessions"], ["store", "init"], ["hosts"], ["serve"]])
def test_a_query_parameter_password_is_never_printed_in_an_error(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"postgresql:///db?host=127.0.0.1&port={_closed_port()}&password=sekrit&connect_timeout=2"
    args = [*command, url] if command[0] == "store" else [*command, "--store", url]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "sekrit" not in err and "password=***" in err, err


def test_a_folder_store_is_the_file_store_at_that_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    from subagents.runtime.hosts.demo import run_demo

    async def make() -> None:
        async with open_runtime(tmp_path / "mail", store=str(tmp_path / "logs")) as rt:
            assert isinstance(rt.log_store, FileLogStore)
        await run_demo(str(tmp_path / "mail"), store=str(tmp_path / "logs"), out=io.StringIO(), delay_scale=0.0)

    trio.run(make)
    assert list((tmp_path / "logs").rglob("session.jsonl*")) and not list((tmp_path / "mail").rglob("session.jsonl*"))
    assert main(["sessions", "--store", str(tmp_path / "missing")]) == 2
    assert "not a subagents root" in capsys.readouterr().err


def test_read_only_commands_do_not_import_psycopg(tmp_path: Path) -> None:
    code = (
        "import sys; from subagents.runtime.hosts.cli import main; "
        f"main(['sessions', '--root', {str(tmp_path)!r}]); "
        "print('psycopg' in sys.modules)"
    )
    (tmp_path / "sessions").mkdir()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[-1] == "False", done.stderr


@pytest.mark.pg
def test_store_init_names_the_store_without_its_password(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"{pg_url}&password=sekrit-in-the-query"  # the embedded server trusts its socket
    assert main(["store", "init", url]) == 0
    out = capsys.readouterr().out
    assert "sekrit" not in out and "password=***" in out and "schema ready" in out


def test_open_runtime_with_a_postgresql_url_runs_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    async def body() -> list[str]:
        async with open_runtime(tmp_path / "mail", store=pg_url) as rt:
            assert isinstance(rt.log_store, PostgresLogStore)
            return [r.id for r in await rt.query.list_sessions()]

    assert trio.run(body) == []
    with pytest.raises(TypeError):
        trio.run(lambda: open_runtime(tmp_path, store=pg_url, log_store=FileLogStore(str(tmp_path))).__aenter__())


@pytest.mark.pg
@pytest.mark.slow  # subprocesses: the demo's two runtimes and the read-only commands
def test_demo_on_postgresql_ends_ok_and_its_export_lists_the_same(tmp_path: Path, pg_url: str) -> None:
    from pg_server import reset_tables

    reset_tables(pg_url)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=180)

    done = cli("demo", "--store", pg_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-4:] == EXPECTED_END
    assert not list(tmp_path.rglob("session.jsonl*"))  # the logs and the mailbox are in PostgreSQL
    sessions = json.loads(cli("sessions", "--json", "--store", pg_url).stdout)
    assert sorted(s["id"] for s in sessions) == ["demo-1", "demo-2", "demo-3", "demo-4"]
    on_pg = cli("children", "demo-1", "--store", pg_url)
    assert on_pg.returncode == 0, on_pg.stderr
    exported = cli("export", "--store", pg_url, "--to", "files")
    assert exported.returncode == 0, exported.stderr
    on_files = cli("children", "demo-1", "--root", "files")
    assert on_files.returncode == 0 and on_files.stdout == on_pg.stdout
    assert len(on_files.stdout.splitlines()) == 4  # a header and the three children
    shown = cli("show", "demo-2", "--store", pg_url).stdout
    assert shown == cli("show", "demo-2", "--root", "files").stdout and shown.count("── turn") == 2


@pytest.mark.pg
def test_run_send_and_tail_reach_a_session_on_postgresql(
    tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli_process import write_script
    from pg_server import reset_tables

    reset_tables(pg_url)
    model = write_script(tmp_path / "s.json", {"agents": [{"responses": [{"text": "Hello from PostgreSQL"}]}]})
    where = ["--store", pg_url, "--root", str(tmp_path / "mail")]
    assert main(["run", *where, "--model", model, "--session", "s1", "say hi"]) == 0
    assert capsys.readouterr().out == "Hello from PostgreSQL\n"
    assert not list(tmp_path.rglob("session.jsonl*"))
    assert main(["tail", "s1", *where]) == 0
    types = [json.loads(line)["type"] for line in capsys.readouterr().out.splitlines()]
    assert types[0] == "turn/start" and types[-1] == "turn/end" and "assistant/message" in types
    assert main(["send", "s1", "later", "--queue", *where]) == 0
    assert "delivered to session s1 (not running" in capsys.readouterr().out
    answers = [{"text": "Answered on PostgreSQL"}, {"text": "Answered on PostgreSQL"}]  # the queued one too
    again = write_script(tmp_path / "t.json", {"agents": [{"responses": answers}]})
    assert main(["send", "s1", "now", "--model", again, *where]) == 0  # nobody runs it: resumed here
    assert "Answered on PostgreSQL" in capsys.readouterr().out
    assert main(["tail", "s1", *where]) == 0
    ends = [line for line in capsys.readouterr().out.splitlines() if '"type":"turn/end"' in line]
    assert len(ends) >= 2  # the first run's, then the resumed one's (the queued message's too)
    assert main(["sessions", "--json", *where]) == 0
    assert [row["id"] for row in json.loads(capsys.readouterr().out)] == ["s1"]


# --- read-only commands on a database without the schema (or with another version) ---

NOT_INITIALIZED = "is not initialized: run `subagents store init URL`"


@pytest.fixture(scope="module")
def empty_url(pg_server: Any) -> Any:
    """A database of its own, which only the write commands below may give a schema."""
    from pg_server import drop_database, fresh_database

    yield fresh_database(pg_server.url, "t_store_select_empty")
    drop_database(pg_server.url, "t_store_select_empty")


def _tables(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(url) as db:
        rows = db.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1").fetchall()
    return [r[0] for r in rows]


def _version(url: str, version: int) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        db.execute("UPDATE schema_version SET version = %s", (version,))


# The read-only commands that name no model.
READS = [["sessions"], ["sessions", "--json"], ["show", "s1"], ["children", "s1"], ["agents", "s1"], ["tail", "s1"]]


@pytest.mark.pg
@pytest.mark.parametrize(
    "command",
    [
        *READS,
        ["tail", "-f", "s1"],
        ["send", "s1", "hello", "--queue"],
        ["send", "s1", "hello", "--model", "scripted:/nonexistent.json"],
        ["interrupt", "s1"],
        ["stop", "s1"],
    ],
    ids=lambda c: "-".join(c[:2]),
)
def test_a_read_only_command_on_an_empty_database_says_so_and_creates_nothing(
    tmp_path: Path, empty_url: str, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--store", empty_url, "--root", str(tmp_path / "r")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert (
        captured.err.startswith("subagents: the PostgreSQL store at postgresql://") and NOT_INITIALIZED in captured.err
    )
    assert _tables(empty_url) == []  # no schema made
    assert not (tmp_path / "r").exists()


@pytest.mark.pg
def test_export_of_an_empty_database_says_so_and_store_init_then_makes_it_listable(
    tmp_path: Path, empty_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", "--store", empty_url, "--to", str(tmp_path / "out")]) == 2
    assert NOT_INITIALIZED in capsys.readouterr().err
    assert _tables(empty_url) == []
    try:
        assert main(["store", "init", empty_url]) == 0
        assert capsys.readouterr().out.endswith("schema ready (0 sessions)\n")
        assert main(["sessions", "--store", empty_url]) == 0
        assert capsys.readouterr().out == "(no sessions)\n"
        # An older schema: read-only commands ask for a migration; `store init` makes it.
        _version(empty_url, 1)
        assert main(["sessions", "--store", empty_url]) == 2
        err = capsys.readouterr().err
        assert "has schema version 1 (this build: " in err and "to migrate it" in err and err.count("\n") == 1
        with pytest.raises(StoreNotInitialized):
            PostgresLogStore(empty_url, create_schema=False)
    finally:
        import psycopg

        with psycopg.connect(empty_url, autocommit=True) as db:  # empty again for the other tests
            db.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")


@pytest.mark.pg
@pytest.mark.parametrize("command", [["sessions"], ["show", "s1"], ["tail", "s1"], ["run", "hi", "--model", "x:y"]])
def test_a_newer_schema_is_one_line_exit_2_and_left_untouched(
    pg_url: str, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from subagents.storage import UnsupportedLog

    PostgresLogStore(pg_url).close_store()
    _version(pg_url, 99)
    try:
        with pytest.raises(UnsupportedLog) as raised:
            PostgresLogStore(pg_url, create_schema=False)
        assert raised.value.code == "STORAGE_UNSUPPORTED_FORMAT"
        assert main([*command, "--store", pg_url]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1
        assert "schema version 99" in captured.err and "Traceback" not in captured.err
        import psycopg

        with psycopg.connect(pg_url) as db:
            assert db.execute("SELECT version FROM schema_version").fetchone() == (99,)
    finally:
        from subagents.storage.pg_schema import SCHEMA_VERSION

        _version(pg_url, SCHEMA_VERSION)


# --- timeouts: a server that does not answer is one line, exit 2 ---


def _with_statement_timeout(url: str, ms: int) -> str:
    return f"{url}{'&' if '?' in url else '?'}options=-c%20statement_timeout%3D{ms}"


@pytest.mark.pg
@pytest.mark.parametrize(
    "command",
    [*READS, ["send", "s1", "hello", "--queue"], ["interrupt", "s1"]],
)
def test_a_server_stuck_behind_a_lock_is_one_line_exit_2(
    pg_url: str, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    import psycopg

    PostgresLogStore(pg_url).close_store()  # the schema
    url = _with_statement_timeout(pg_url, 100)
    with psycopg.connect(pg_url) as holder:  # a transaction that holds the lock until it ends
        holder.execute("LOCK TABLE sessions IN ACCESS EXCLUSIVE MODE")
        code = main([*command, "--store", url])
        holder.rollback()
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.out == "" and captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert "did not answer in time (canceling statement due to statement timeout" in captured.err


@pytest.mark.pg
def test_every_connection_has_a_connect_and_a_statement_timeout(pg_url: str) -> None:
    from subagents.storage.pg_connect import connect
    from subagents.storage.pg_timeouts import connection_options

    assert connection_options(pg_url) == {"connect_timeout": 10, "options": "-c statement_timeout=30s"}
    url = _with_statement_timeout(f"{pg_url}&connect_timeout=3", 1500)
    assert connection_options(url) == {}  # the URL's own settings, as libpq reads them
    both = f"{pg_url}&options=-c%20search_path%3Dpublic"
    assert connection_options(both) == {
        "connect_timeout": 10,
        "options": "-c search_path=public -c statement_timeout=30s",
    }
    for given, want in ((pg_url, "30s"), (url, "1500ms")):
        with connect(given, "test") as conn:
            assert conn.execute("SHOW statement_timeout").fetchone() == (want,)
            assert conn.info.get_parameters()["connect_timeout"] == ("10" if given == pg_url else "3")
