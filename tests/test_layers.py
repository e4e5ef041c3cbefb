"""The layering rules of SPEC 2, checked on the source: imports point downward only, each layer
imports only the third-party packages its row allows, a layer imports a lower one only through
its face (`subagents.storage`, `subagents.actors`; never a module past it, nor the test doubles
of `subagents.storage.testing`), nothing imports a layer unprefixed, no two modules import
each other (directly or through a cycle), and tests import through the faces too, except a listed
set of white-box tests of internals."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAYERS = ("storage", "actors", "runtime")  # bottom to top
ALLOWED_THIRD_PARTY = {
    # psycopg: the PostgreSQL store only (storage/pg_*.py), imported lazily (SPEC §2).
    "storage": {"attrs", "cattrs", "msgspec", "zstandard", "psycopg"},
    "actors": {"attrs", "cattrs", "msgspec", "zstandard", "trio", "trio_util"},
    # prompt_toolkit: `chat`'s prompt, imported lazily by runtime/hosts/chat/terminal.py only;
    # platformdirs: the user's config folder (runtime/config.py). SPEC §2 lists both.
    # mcp (and anyio, which it runs on): the optional extra, imported lazily by runtime/tools/mcp_connection.py only.
    "runtime": {
        "attrs",
        "cattrs",
        "msgspec",
        "zstandard",
        "trio",
        "trio_util",
        "httpx",
        "rich",
        "prompt_toolkit",
        "platformdirs",
        "mcp",
        "anyio",
        # opentelemetry: the `otel` extra, imported only when tracing is on (runtime/telemetry/).
        "opentelemetry",
        # starlette, hypercorn, jinja2: the `web` extra, imported only by runtime/hosts/web/ (the
        # `web` command loads it when it runs).
        "starlette",
        "hypercorn",
        "jinja2",
    },
}
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def _modules() -> dict[str, Path]:
    """Installed module name → source file, for every module of the three layers."""
    found = {}
    for layer in LAYERS:
        for path in sorted((REPO / layer).rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(["subagents", *parts])] = path
    return found


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """Absolute names of everything `path` imports, with line numbers (`from a import b` names
    `a.b` when that is a module of the layers, else `a`)."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: -(node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                if node.module is None:
                    out.extend((f"{target}.{alias.name}", node.lineno) for alias in node.names)
                else:
                    out.append((target, node.lineno))
            else:
                module = node.module or ""
                submodules = [f"{module}.{alias.name}" for alias in node.names]
                out.extend((sub, node.lineno) for sub in submodules if sub in MODULES)
                if len(submodules) > len([sub for sub in submodules if sub in MODULES]):
                    out.append((module, node.lineno))
    return out


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "subagents" and len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    return None


MODULES = _modules()
FACES = {"storage": "subagents.storage", "actors": "subagents.actors"}  # what a higher layer may import
TEST_DOUBLES = "subagents.storage.testing"


def _face_problems(module: str, path: Path) -> list[str]:
    """Imports of `module` (at `path`) that reach into another layer past its face."""
    layer = _layer_of(module)
    problems = []
    for target, line in _imports(module, path):
        target_layer = _layer_of(target)
        if target_layer is None or target_layer == layer:
            continue
        if target == TEST_DOUBLES or target.startswith(f"{TEST_DOUBLES}."):
            problems.append(f"line {line}: {layer} imports the test doubles {target!r}")
        elif target != FACES.get(target_layer):
            problems.append(f"line {line}: {layer} imports {target!r} past the face {FACES.get(target_layer)!r}")
    return problems


def test_every_layer_has_modules() -> None:
    assert {_layer_of(m) for m in MODULES} == set(LAYERS)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_downward_only(module: str) -> None:
    layer = _layer_of(module)
    assert layer is not None
    rank = LAYERS.index(layer)
    problems = []
    for target, line in _imports(module, MODULES[module]):
        top = target.split(".")[0]
        if top in LAYERS:
            problems.append(f"line {line}: unprefixed import of {target!r}")
        elif top == "subagents":
            target_layer = _layer_of(target)
            if target_layer is None:
                problems.append(f"line {line}: {target!r} is not in a layer")
            elif LAYERS.index(target_layer) > rank:
                problems.append(f"line {line}: {layer} imports the higher layer {target!r}")
        elif top not in STDLIB and top not in ALLOWED_THIRD_PARTY[layer]:
            problems.append(f"line {line}: {layer} may not import {top!r}")
    assert problems == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_other_layers_are_imported_through_their_faces(module: str) -> None:
    assert _face_problems(module, MODULES[module]) == []


def test_the_face_check_refuses_deep_imports_and_the_test_doubles(tmp_path: Path) -> None:
    fake = tmp_path / "fake.py"
    fake.write_text(
        "from subagents.storage.file_store import FileLogStore\n"
        "import subagents.storage.projection\n"
        "from subagents.storage import testing\n"
        "from subagents.storage.testing import MemoryLogStore\n"
        "from subagents.storage import FileLogStore, SessionHeader\n"
    )
    assert _face_problems("subagents.actors.fake", fake) == [
        "line 1: actors imports 'subagents.storage.file_store' past the face 'subagents.storage'",
        "line 2: actors imports 'subagents.storage.projection' past the face 'subagents.storage'",
        "line 3: actors imports the test doubles 'subagents.storage.testing'",
        "line 4: actors imports the test doubles 'subagents.storage.testing'",
    ]
    fake.write_text(
        "from subagents.actors.cold_reader import ColdReader\n"
        "from subagents.actors import SessionStore\n"
        "from subagents.storage import FileLogStore\n"
        "from subagents.storage.testing.memory_store import MemoryLogStore\n"
        "from .query import SessionQuery\n"
    )
    assert _face_problems("subagents.runtime.fake", fake) == [
        "line 1: runtime imports 'subagents.actors.cold_reader' past the face 'subagents.actors'",
        "line 4: runtime imports the test doubles 'subagents.storage.testing.memory_store'",
    ]
    # Inside its own layer a module imports whatever it needs.
    fake.write_text("from subagents.storage.file_store import FileLogStore\nfrom .testing import CrashFs\n")
    assert _face_problems("subagents.storage.fake", fake) == []


def _own_layer_by_name(module: str, path: Path) -> list[str]:
    """Imports of `module` (at `path`) that name its own layer absolutely (`subagents.<layer>...`).
    Inside a layer the imports are relative: the type checker reads the layers through a link tree
    (`.venv/typecheck`), so one file imported under both names is two modules to it, and their
    classes two unrelated types."""
    layer = _layer_of(module)
    own = f"subagents.{layer}"
    problems = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        problems.extend(
            f"line {node.lineno}: {layer} imports its own layer as {name!r}"
            for name in names
            if name == own or name.startswith(f"{own}.")
        )
    return problems


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_layer_imports_its_own_modules_relatively(module: str) -> None:
    assert _own_layer_by_name(module, MODULES[module]) == []


def test_the_own_layer_check_refuses_absolute_names(tmp_path: Path) -> None:
    fake = tmp_path / "fake.py"
    fake.write_text(
        "from subagents.runtime.query import SessionQuery\n"
        "import subagents.runtime.app\n"
        "from subagents.runtime import open_runtime\n"
        "from subagents.storage import FileLogStore\n"
        "from subagents.actors import SessionStore\n"
        "from ..query import SessionRecord\n"
        "from . import lineage\n"
    )
    assert _own_layer_by_name("subagents.runtime.delegation.fake", fake) == [
        "line 1: runtime imports its own layer as 'subagents.runtime.query'",
        "line 2: runtime imports its own layer as 'subagents.runtime.app'",
        "line 3: runtime imports its own layer as 'subagents.runtime'",
    ]
    assert _own_layer_by_name("subagents.storage.fake", fake) == [
        "line 4: storage imports its own layer as 'subagents.storage'"
    ]
    fake.write_text("from subagents.storagex import x\nfrom .file_store import FileLogStore\n")
    assert _own_layer_by_name("subagents.storage.fake", fake) == []


# The runtime's rooms, bottom to top (docs/design.md, "Rooms"). A module's room is the longest
# prefix below that names it; it may import its own room and the rooms below, never one above.
# The package faces (`__init__`) re-export lazily and are left out.
RUNTIME_ROOMS: tuple[tuple[str, ...], ...] = (
    ("foundation",),
    # tracing's seam and its OpenTelemetry implementation, below the loop that calls it
    ("telemetry",),
    # models, and the model test bed they build from `scripted:PATH`; the read seam's bottom
    (
        "models",
        "testing.scripted_model",
        "testing.script_format",
        "testing.script_waits",
        "testing.script_json",
        "testing.script_render",
        "query",
        "query_corpus",
        "store_select",
        "event_stream",
        "log_follow",
    ),
    # the command sandbox (bubblewrap), below the tools that run commands in it
    ("sandbox",),
    ("tools",),
    ("agent",),
    ("delegation",),
    # the library a host embeds
    ("app", "read_side", "usage", "usage_totals", "config", "lease_renewal"),
    # hosts, and the scenario runner that drives the library like one
    ("hosts", "testing"),
)


def _room_of(module: str) -> int:
    """The rank of a runtime module's (or sub-package's) room."""
    rest = module.removeprefix("subagents.runtime.")
    best: tuple[int, int] | None = None
    for rank, room in enumerate(RUNTIME_ROOMS):
        for name in room:
            if (rest == name or rest.startswith(name + ".")) and (best is None or len(name) > best[1]):
                best = (rank, len(name))
    if best is None:
        raise AssertionError(f"{module} is in no room of RUNTIME_ROOMS")
    return best[0]


def _room_problems(module: str, path: Path) -> list[str]:
    """Imports of the runtime module `module` (at `path`) that reach a higher room. The package
    faces re-export lazily and have no room of their own."""
    if path.name == "__init__.py":
        return []
    rank = _room_of(module)
    problems = []
    for target, line in _imports(module, path):
        if target == "subagents.runtime":
            problems.append(f"line {line}: imports the runtime's face")
        elif target.startswith("subagents.runtime.") and _room_of(target) > rank:
            problems.append(f"line {line}: {RUNTIME_ROOMS[rank][0]} imports {target!r} of a higher room")
    return problems


def test_every_runtime_module_has_a_room() -> None:
    for module, path in MODULES.items():
        if module.startswith("subagents.runtime.") and path.name != "__init__.py":
            _room_of(module)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("subagents.runtime.")))
def test_runtime_rooms_point_downward_only(module: str) -> None:
    assert _room_problems(module, MODULES[module]) == []


def test_the_room_check_refuses_a_host_import_from_the_library(tmp_path: Path) -> None:
    fake = tmp_path / "fake.py"
    fake.write_text(
        "from ..hosts.cli import main\n"
        "from subagents.runtime.delegation.service import SubagentService\n"
        "from ..foundation.errors import CliError\n"
        "from ..models import base\n"
    )
    assert _room_problems("subagents.runtime.agent.fake", fake) == [
        "line 1: agent imports 'subagents.runtime.hosts.cli' of a higher room",
        "line 2: agent imports 'subagents.runtime.delegation.service' of a higher room",
    ]
    fake.write_text("from subagents.runtime.app import open_runtime\nfrom subagents.runtime.testing import scenario\n")
    assert _room_problems("subagents.runtime.hosts.fake", fake) == []
    assert _room_problems("subagents.runtime.app", fake) == [
        "line 2: app imports 'subagents.runtime.testing.scenario' of a higher room"
    ]


WEB_PACKAGES = ("starlette", "hypercorn", "jinja2")  # the `web` extra


def test_only_the_web_room_imports_the_web_extra() -> None:
    """The `web` extra is optional: no module outside runtime/hosts/web/ imports it (the CLI's
    `web` command reaches that room only when it runs)."""
    found = [
        f"{module} imports {target}"
        for module, path in MODULES.items()
        if not module.startswith("subagents.runtime.hosts.web")
        for target, _line in _imports(module, path)
        if target.split(".")[0] in WEB_PACKAGES
    ]
    assert found == []


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        deps = set()
        for target, _line in _imports(module, path):
            # `from .x import y` may name a module `x.y` or an attribute of `x`.
            for candidate in (target, target.rpartition(".")[0]):
                if candidate in MODULES and candidate != module:
                    deps.add(candidate)
                    break
        graph[module] = deps
    # A package's __init__ re-exports its modules; an edge into a package's own __init__ from a
    # module inside it would be a cycle, and is counted as one.
    visiting: set[str] = set()
    done: set[str] = set()
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        if node in done:
            return
        if node in visiting:
            cycles.append(trail[trail.index(node) :] + [node])
            return
        visiting.add(node)
        for dep in sorted(graph[node]):
            visit(dep, [*trail, node])
        visiting.discard(node)
        done.add(node)

    for module in sorted(graph):
        visit(module, [])
    assert cycles == []


@pytest.mark.parametrize("name", LAYERS)
def test_layers_are_not_importable_unprefixed(name: str) -> None:
    # `pytest --import-mode=importlib` keeps the repository root off sys.path, so the source
    # folders can never shadow (or stand in for) the installed package.
    assert importlib.util.find_spec(name) is None, f"{name!r} is importable without the prefix"
    assert importlib.util.find_spec(f"subagents.{name}") is not None


def test_tests_and_benchmarks_import_only_prefixed_names() -> None:
    problems = []
    for folder in ("tests", "bench", "scenarios"):
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module]
                for n in names:
                    if n.split(".")[0] in LAYERS:
                        problems.append(f"{path.relative_to(REPO)}:{node.lineno}: {n}")
    assert problems == []


# What a test may import of the layers: the faces, and the runtime's error tree (README,
# "Errors": every class is in `subagents.runtime.foundation.errors`).
TEST_FACES = {
    "subagents.storage",
    "subagents.storage.testing",
    "subagents.actors",
    "subagents.runtime",
    "subagents.runtime.testing",
    "subagents.runtime.hosts.cli",
    "subagents.runtime.foundation.errors",
}
# White-box tests of internals: the only test modules that import past the faces, by kind.
WHITE_BOX = {
    # storage's byte format and its private parts (codecs, records, framing, file names, forms)
    "tests/helpers/log_lines.py",  # hand-written log lines
    "tests/storage/test_codec.py",
    "tests/storage/test_closers.py",  # decodes the closers' events
    "tests/storage/test_continuation.py",  # decodes a damaged line by hand
    "tests/storage/test_crash_durability.py",  # the Fs seam's File and OpenMode
    "tests/storage/test_face.py",  # the face against the modules behind it
    "tests/storage/test_hostile_input.py",  # counts framing's payload checks
    "tests/storage/test_log_store_conformance.py",  # the log file names
    "tests/storage/test_read_path.py",  # patches framing and the file store
    "tests/storage/test_reader_fuzz.py",  # the reader's chunk size
    "tests/storage/test_sigkill.py",
    "tests/storage/test_zstd_form.py",
    "tests/storage/test_frame_compressors.py",  # one zstd compressor per thread
    "tests/runtime/test_subagents_e2e.py",  # writes a damaged log by hand
    # the mailbox's envelope bytes
    "tests/storage/test_mailbox_conformance.py",
    "tests/runtime/test_mailbox_cli.py",
    # the listing's row cache (the session index and its rows)
    "tests/storage/test_claimed_headers.py",
    "tests/storage/test_index.py",
    "tests/storage/test_projection_types.py",
    "tests/runtime/test_one_verdict.py",
    "tests/runtime/test_writeback.py",
    # the PostgreSQL schema, leases and connections
    "tests/storage/test_pg_leases.py",
    "tests/storage/test_pg_mailbox.py",
    "tests/storage/test_pg_store.py",
    "tests/runtime/test_store_select.py",
    "tests/runtime/test_failover.py",  # finds a host's owner connection by its liveness lock key
    # storage's lock table and folder watch
    "tests/storage/test_locks.py",
    "tests/storage/test_watch.py",
    "tests/storage/test_log_watch.py",
    "tests/runtime/test_cli_live.py",  # which write locks a process holds
    # the error modules of every layer, against the tree drawn at their tops
    "tests/test_error_tree.py",
    # the actors' internals (the actor mailbox, append requests)
    "tests/actors/test_fanout.py",
    "tests/actors/test_mailbox.py",
    "tests/actors/test_session_store.py",  # the runtime's identity unit
    # unit tests of one runtime module (descriptor, units, budgets, agent types, config, inbox,
    # messages, compaction, tool framework, MCP rendering, the OpenAI wire, the scripted model's
    # parsers, usage folds, the subagent tools' renders, lease renewal, the mailbox owner)
    "tests/helpers/descriptors.py",
    "tests/helpers/wrapped_models.py",  # binds a model as the tee does
    "tests/runtime/test_agent_loop.py",  # the surface the loop folds
    "tests/runtime/test_agent_types.py",
    "tests/runtime/test_agent_units.py",
    "tests/runtime/test_budgets.py",
    "tests/runtime/test_budget_tree.py",  # the tree ledger and the prices, without a runtime
    "tests/runtime/test_budget_shared.py",  # the ledger's turns and the usage unit, beside a runtime
    "tests/runtime/test_budget_links.py",  # the ledger's links past an absent parent, beside a runtime
    "tests/runtime/test_pricing.py",  # the config loader and the usage fold beside the prices
    "tests/runtime/test_catalog_unit.py",
    "tests/runtime/test_child_options.py",
    "tests/runtime/test_config.py",
    "tests/runtime/test_descriptor.py",
    "tests/runtime/test_flags_unit.py",
    "tests/runtime/test_inbox_statistics.py",
    "tests/runtime/test_lease_renewal.py",
    "tests/runtime/test_mailbox_owner.py",
    "tests/runtime/test_model_record.py",
    "tests/runtime/test_mcp_units.py",
    "tests/runtime/test_openai_model.py",
    "tests/runtime/test_openai_secrets.py",
    "tests/runtime/test_openai_wire.py",
    "tests/runtime/test_models_anthropic.py",  # the Anthropic transport, its options and clock
    "tests/runtime/test_models_anthropic_wire.py",  # the Anthropic wire and the model specs
    "tests/runtime/test_ownership_lost.py",  # envelopes as the mailbox owner makes them
    "tests/runtime/test_pg_clock.py",  # envelopes as the mailbox owner makes them
    "tests/runtime/test_scripted_model.py",
    "tests/runtime/test_scripted_stall.py",
    "tests/runtime/test_stopping.py",  # the stopped projection (issue 27)
    "tests/runtime/test_subagent_tools.py",
    "tests/runtime/test_telemetry_settings.py",  # the tracing settings table
    "tests/runtime/test_telemetry.py",  # the seam's agent name (a pure table) beside the span trees
    "tests/runtime/test_units.py",
    "tests/runtime/test_usage.py",
    "tests/runtime/test_workspace_tools.py",
    "tests/runtime/test_sandbox.py",  # the box around run_command, with a fake HOME and PATH
    "tests/runtime/test_sandbox_units.py",  # the argv, the environment, the policy, the permissions
    # the read seam built by hand (the query, the listing and its row cache, the read side)
    "tests/runtime/test_listing.py",
    "tests/runtime/test_listing_abort.py",
    "tests/runtime/test_listing_liveness.py",  # the rows' liveness, the state words, stall_after's reader
    "tests/runtime/test_listing_memory.py",
    "tests/runtime/test_listing_perf_semantics.py",
    "tests/runtime/test_listing_warm.py",
    "tests/runtime/test_query.py",
    "tests/runtime/test_read_side.py",
    "tests/runtime/test_spec_texts.py",
    # the subagent service's seams (the crash driver's residency, routing, reservations)
    "tests/runtime/subagent_driver.py",
    "tests/runtime/test_deterministic_logs.py",
    "tests/runtime/test_subagent_service.py",
    # hosts below the CLI's face (ACP, chat, serve, demo, run output and progress, transfer)
    "tests/helpers/acp_gated_agent.py",
    "tests/helpers/memory_hosts.py",
    "tests/helpers/web_console.py",  # the web tests' shared set-up: the console's app and server
    "tests/runtime/test_acp_children.py",
    "tests/runtime/test_acp_live.py",
    "tests/runtime/test_acp_mcp.py",
    "tests/runtime/test_acp_mcp_units.py",
    "tests/runtime/test_acp_server.py",
    "tests/runtime/test_acp_units.py",
    "tests/runtime/test_chat.py",
    "tests/runtime/test_web.py",  # the web console's app, security rules and server
    "tests/runtime/test_web_live.py",  # the console's pulse, store banner and damaged feeds
    "tests/runtime/test_web_data.py",  # the web console's data: its app, views and feed start
    "tests/runtime/test_web_models.py",  # the console's model before a first call: its views and descriptors
    "tests/runtime/test_web_pulse_pg.py",  # the console's pulse on PostgreSQL
    "tests/runtime/test_web_orphans.py",  # the console's overview: its stalled module and app
    "tests/runtime/test_chat_input.py",
    "tests/runtime/test_chat_terminal.py",
    "tests/runtime/test_cli_readable.py",  # patches the CLI's entry module
    "tests/runtime/test_demo.py",
    "tests/runtime/test_event_stream.py",
    "tests/runtime/test_event_stream_follow.py",
    "tests/runtime/test_placement.py",
    "tests/runtime/test_placement_faults.py",
    "tests/runtime/test_run_progress.py",
    "tests/runtime/test_store_transfer.py",
}
TEST_MODULES = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("*.py"))


def _test_import_problems(path: Path) -> list[str]:
    """Imports of the test module at `path` that reach a layer past the faces."""
    problems = []
    for target, line in _imports("tests.module", path):
        if target.split(".")[0] == "subagents" and target not in TEST_FACES:
            problems.append(f"line {line}: imports {target!r} past the faces")
    return problems


@pytest.mark.parametrize("path", [p for p in TEST_MODULES if p not in WHITE_BOX])
def test_tests_import_through_the_faces(path: str) -> None:
    assert _test_import_problems(REPO / path) == []


@pytest.mark.parametrize("path", sorted(WHITE_BOX))
def test_white_box_tests_do_reach_past_the_faces(path: str) -> None:
    # A listed module that no longer imports an internal leaves the list.
    assert _test_import_problems(REPO / path) != []


def test_the_test_import_check_refuses_internals(tmp_path: Path) -> None:
    fake = tmp_path / "test_fake.py"
    fake.write_text(
        "from subagents.storage import Batch, framing\n"
        "from subagents.runtime.delegation.units import SUBAGENT_UNITS\n"
        "import subagents.actors.cold_reader\n"
        "from subagents.runtime.foundation import errors\n"
        "from subagents.runtime.testing import ScriptedModel, scenario\n"
        "from subagents.runtime.hosts.cli import main\n"
        "import subagents.storage.testing\n"
    )
    assert _test_import_problems(fake) == [
        "line 1: imports 'subagents.storage.framing' past the faces",
        "line 2: imports 'subagents.runtime.delegation.units' past the faces",
        "line 3: imports 'subagents.actors.cold_reader' past the faces",
        "line 5: imports 'subagents.runtime.testing.scenario' past the faces",
    ]
