"""Start-up of the read-only commands (issue 20, item 2): `children`, `agents`, `sessions`, `show`,
`tail` (without -f) and `config` load only the storage, the actors, the query and the listing —
no HTTP client, terminal UI, line editor, MCP SDK, PostgreSQL driver (the store is files here),
model transports, agent loop or tools — and still print what they printed before.

Each command runs in a fresh interpreter through a tiny wrapper that calls the CLI's `main` and
writes the names in `sys.modules` at its end to a file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_process import clean_env
from descriptors import descriptor
from events import assistant_event, turn_end_event, turn_start_event
from log_lines import plain_bytes
from subagents.runtime.hosts.cli import main
from subagents.storage import Batch, Event, FileLogStore, LogStore, Offset, OsFs, SessionHeader, make_event

# Every test but the last starts Python processes.
slow = pytest.mark.slow

_WRAPPER = """
import json, sys
from subagents.runtime.hosts.cli import main
code = 1
try:
    code = main(sys.argv[2:])
finally:
    with open(sys.argv[1], "w") as out:
        json.dump(sorted(sys.modules), out)
sys.exit(code)
"""

# Third-party packages no read-only command may load (psycopg: the store here is files;
# opentelemetry: the `otel` extra, loaded only by a host with tracing on; starlette, hypercorn,
# jinja2: the `web` extra, loaded only by `subagents web`).
HEAVY_PACKAGES = (
    "httpx",
    "httpcore",
    "h11",
    "rich",
    "pygments",
    "prompt_toolkit",
    "mcp",
    "anyio",
    "psycopg",
    "anthropic",
    "pydantic",
    "opentelemetry",
    "starlette",
    "hypercorn",
    "jinja2",
)
# Runtime modules of the hosts: the agent loop, the models, the tools, the composition root and
# what only a host (run, chat, acp, demo, scenario) uses.
HOST_MODULES = (
    "subagents.runtime.agent",
    "subagents.runtime.tools",
    "subagents.runtime.models.base",
    "subagents.runtime.models.openai",
    "subagents.runtime.models.openai_wire",
    "subagents.runtime.models.http_stream",
    "subagents.runtime.models.anthropic",
    "subagents.runtime.models.anthropic_wire",
    "subagents.runtime.models.sse",
    "subagents.runtime.models.specs",
    "subagents.runtime.testing.scripted_model",
    "subagents.runtime.testing.script_format",
    "subagents.runtime.hosts.acp",
    "subagents.runtime.app",
    "subagents.runtime.agent.mailbox_owner",
    "subagents.runtime.hosts.setup",
    "subagents.runtime.hosts.demo",
    "subagents.runtime.testing.scenario",
    "subagents.runtime.hosts.chat.host",
    "subagents.runtime.hosts.chat.view",
    "subagents.runtime.hosts.chat.terminal",
    "subagents.runtime.delegation.service",
    "subagents.runtime.delegation.settlement",
    "subagents.runtime.hosts.web",
)
# `config` reads the MCP server entries of subagents.toml (plain values; nothing there imports mcp)
# and shows the default permission rules (their module loads no tool).
CONFIG_ALLOWED = ("subagents.runtime.tools", "subagents.runtime.tools.mcp_spec", "subagents.runtime.tools.permissions")


def _heavy(modules: list[str], allowed: tuple[str, ...] = ()) -> list[str]:
    found = []
    for name in modules:
        if name in allowed:
            continue
        if name.split(".")[0] in HEAVY_PACKAGES:
            found.append(name)
        elif any(name == host or name.startswith(f"{host}.") for host in HOST_MODULES):
            found.append(name)
    return found


def _write(store: LogStore, header: SessionHeader, events: list[Event]) -> None:
    handle = store.create(header)
    try:
        store.append(handle, [Batch(Offset(0), events)])
    finally:
        store.close(handle)


def _write_boss_and_helper(store: LogStore) -> None:
    """A root session `boss` with one continuable child `helper`, written by hand."""
    try:
        boss = SessionHeader(id="boss", created_at=1796131041000, delegation_depth=0, cwd="/w")  # type: ignore[arg-type]  # a plain str id
        _write(
            store,
            boss,
            [turn_start_event(0, 1796131041001), assistant_event(1, 1796131041002, text="hi"), turn_end_event(2, 3)],
        )
        helper = SessionHeader(
            id="helper",  # type: ignore[arg-type]  # a plain str id
            created_at=1796131042000,
            delegation_depth=1,
            cwd="/w",
            parent_session="boss",  # type: ignore[arg-type]  # a plain str where the header takes a SessionId
            origin="subagent",
        )
        _write(
            store,
            helper,
            [make_event(0, "subagent/descriptor", 1796131042001, descriptor("the helper")), turn_start_event(1, 2)],
        )
    finally:
        store.close_store()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("store")
    _write_boss_and_helper(FileLogStore(str(path)))
    return path


def _run(args: list[str], tmp_path: Path, cwd: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    modules_file = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPER, str(modules_file), *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=cwd,
        timeout=60,
    )
    return done, json.loads(modules_file.read_text())


@slow  # a new interpreter per command
def test_children_loads_no_host_module(root: Path, tmp_path: Path) -> None:
    done, modules = _run(["children", "--root", str(root), "boss"], tmp_path, tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    # Issue 29: its last event's own time (read here from its file).
    written = iso_time(
        json.loads(plain_bytes(root / "sessions" / "helper" / "session.jsonl.zst").splitlines()[-1])["time"]
    )
    # Its turn is open and nobody runs it (issue 29: orphaned).
    assert done.stdout.splitlines() == [
        "ID      STATE     MODE         CREATED                   LAST EVENT                RUNNER  CHILDREN  LABEL",
        f"helper  orphaned  continuable  2026-12-01T13:17:22.000Z  {written}  -       no        the helper",
    ]
    assert _heavy(modules) == []
    # What it does load: the storage, the actors, the query and the listing.
    for needed in (
        "subagents.storage",
        "subagents.actors",
        "subagents.runtime.query",
        "subagents.runtime.delegation.listing",
    ):
        assert needed in modules


@slow  # a new interpreter per command
def test_children_json_and_descendants_load_no_host_module(root: Path, tmp_path: Path) -> None:
    done, modules = _run(["children", "--root", str(root), "boss", "--json", "--descendants"], tmp_path, tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert [(row["id"], row["label"], row["depth"]) for row in json.loads(done.stdout)] == [("helper", "the helper", 1)]
    assert _heavy(modules) == []


@slow  # a new interpreter per command
def test_agents_loads_no_host_module(root: Path, tmp_path: Path) -> None:
    done, modules = _run(["agents", "--root", str(root), "boss"], tmp_path, tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "helper [orphaned] — the helper\n"  # its turn is open, nobody runs it
    assert _heavy(modules) == []


@slow  # a new interpreter per command
@pytest.mark.parametrize("as_json", [False, True])
def test_sessions_loads_no_host_module(root: Path, tmp_path: Path, as_json: bool) -> None:
    done, modules = _run(["sessions", "--root", str(root), *(["--json"] if as_json else [])], tmp_path, tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    if as_json:
        rows = json.loads(done.stdout)
        assert [(r["id"], r["parent"], r["events"]) for r in rows] == [("helper", "boss", 2), ("boss", None, 3)]
        assert rows[1]["usage"] is not None  # the usage totals are there (read from the log)
    else:
        assert [line.split()[:6] for line in done.stdout.splitlines()[1:]] == [
            ["helper", "2026-12-01T13:17:22.000Z", "subagent", "boss", "1", "2"],
            ["boss", "2026-12-01T13:17:21.000Z", "-", "-", "0", "3"],
        ]
    assert _heavy(modules) == []


@slow  # a new interpreter per command
def test_show_loads_no_host_module(root: Path, tmp_path: Path) -> None:
    done, modules = _run(["show", "--root", str(root), "boss"], tmp_path, tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert "hi" in done.stdout and "turn 1" in done.stdout
    assert _heavy(modules) == []


@slow  # a new interpreter per command
def test_tail_loads_no_host_module(root: Path, tmp_path: Path) -> None:
    done, modules = _run(["tail", "--root", str(root), "helper"], tmp_path, tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(line["session_id"], line["seq"], line["type"]) for line in lines] == [
        ("helper", 0, "subagent/descriptor"),
        ("helper", 1, "turn/start"),
    ]
    assert _heavy(modules) == []


@slow  # a new interpreter per command
def test_config_loads_no_host_module(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    # Tracing turned on in the file: `config` shows it and still loads none of the extra.
    (project / "subagents.toml").write_text('model = "scripted:s.json"\n[telemetry]\nenabled = true\n')
    done, modules = _run(["config"], tmp_path, project)
    assert "telemetry.enabled = true" in done.stdout
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[0].startswith('model = "scripted:s.json"')
    assert _heavy(modules, CONFIG_ALLOWED) == []


@slow  # a new interpreter per command
def test_a_host_command_still_loads_what_it_runs(tmp_path: Path) -> None:
    # The check above can fail: `run` (a host) loads the agent loop and the models.
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"agents": [{"responses": [{"text": "done"}]}]}))
    done, modules = _run(
        ["run", "--root", str(tmp_path / "r"), "--model", f"scripted:{script}", "go"], tmp_path, tmp_path
    )
    assert (done.returncode, done.stdout) == (0, "done\n")
    assert "subagents.runtime.agent.loop" in _heavy(modules)
    assert "subagents.runtime.testing.scripted_model" in _heavy(modules)
    # Tracing is off (no [telemetry], no OTEL_* variable): nothing of OpenTelemetry is loaded,
    # nor the tracing modules that import it.
    assert [m for m in modules if m.split(".")[0] == "opentelemetry"] == []
    assert "subagents.runtime.telemetry.gen_ai" not in modules
    assert "subagents.runtime.telemetry.seam" in modules  # the no-op seam the loop calls


@slow  # a new interpreter per command
def test_the_wrapper_sees_what_the_console_script_sees(root: Path, tmp_path: Path) -> None:
    # The wrapper runs the same `main` as the `subagents` script (pyproject's console entry).
    script = Path(sys.executable).parent / "subagents"
    assert script.exists()  # the editable install `./dev` makes
    done = subprocess.run(
        [str(script), "children", "--root", str(root), "boss"], capture_output=True, text=True, env=clean_env()
    )
    wrapped, _ = _run(["children", "--root", str(root), "boss"], tmp_path, tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (wrapped.returncode, wrapped.stdout, wrapped.stderr)


@slow  # a new interpreter per command
@pytest.mark.pg
def test_children_of_a_postgresql_store_loads_psycopg_and_no_host_module(pg_url: str, tmp_path: Path) -> None:
    from pg_server import reset_tables
    from subagents.storage import PostgresLogStore

    reset_tables(pg_url)
    _write_boss_and_helper(PostgresLogStore(pg_url))
    done, modules = _run(["children", "--store", pg_url, "boss"], tmp_path, tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["ID", "helper"]
    assert "psycopg" in modules  # the store is PostgreSQL: its driver is what it needs
    assert [name for name in _heavy(modules) if name.split(".")[0] != "psycopg"] == []


def test_children_lists_the_store_once_and_sets_no_watch(
    root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A one-shot command reads one state of the store: the parent is checked against the very
    # corpus the listing uses (one `list()`), and no inotify watch is set up (a store's second
    # listing would set one per session folder, as costly as the listing at 10,000 sessions).
    lists: list[int] = []
    watches: list[str] = []
    listed, watched = FileLogStore.list, OsFs.watch

    def counting_list(self: FileLogStore) -> list[object]:
        lists.append(1)
        return listed(self)

    def counting_watch(self: OsFs, path: str) -> object:
        watches.append(path)
        return watched(self, path)

    monkeypatch.setattr(FileLogStore, "list", counting_list)
    monkeypatch.setattr(OsFs, "watch", counting_watch)
    for args in (["boss"], ["boss", "--descendants"], ["helper"]):
        lists.clear()
        assert main(["children", "--root", str(root), *args]) == 0
        assert (len(lists), watches) == (1, [])
    assert "the helper" in capsys.readouterr().out
    assert main(["children", "--root", str(root), "nobody"]) == 2  # still checked against the corpus
    assert 'session "nobody" not found' in capsys.readouterr().err


def iso_time(ms: int) -> str:
    """Epoch milliseconds as the CLI's tables print them (ISO 8601, UTC, milliseconds)."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"
