"""`subagents.toml`: precedence (flag > project > user > default) key by key and entry by entry,
where each value came from, and every kind of bad file as one `ConfigInvalid` naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from subagents.runtime.config import Config, load_config
from subagents.runtime.foundation.errors import ConfigInvalid, UsageError


def setup(tmp_path: Path, user: str | None = None, project: str | None = None) -> tuple[Path, dict[str, str]]:
    user_dir = tmp_path / "user"
    user_dir.mkdir()
    project_dir = tmp_path / "project"
    project_dir.mkdir()
    if user is not None:
        (user_dir / "subagents.toml").write_text(user)
    if project is not None:
        (project_dir / "subagents.toml").write_text(project)
    return project_dir, {"SUBAGENTS_CONFIG_DIR": str(user_dir)}


def load(tmp_path: Path, user: str | None = None, project: str | None = None, **flags: object) -> Config:
    project_dir, env = setup(tmp_path, user, project)
    return load_config(str(project_dir), flags=flags, env=env)


@pytest.mark.parametrize(
    ("user", "project", "flag", "expected", "source"),
    [
        (None, None, None, "deepseek:deepseek-chat", "default"),
        ('model = "openai:u"', None, None, "openai:u", "user"),
        ('model = "openai:u"', 'model = "openai:p"', None, "openai:p", "project"),
        ('model = "openai:u"', 'model = "openai:p"', "openai:f", "openai:f", "flag --model"),
        (None, None, "openai:f", "openai:f", "flag --model"),
        ('model = "openai:u"', "max_depth = 2", None, "openai:u", "user"),  # the project sets another key
    ],
)
def test_precedence_flag_then_project_then_user_then_default(
    tmp_path: Path, user: str | None, project: str | None, flag: str | None, expected: str, source: str
) -> None:
    config = load(tmp_path, user, project, model=flag)
    assert config.model == expected
    where = config.sources.get("model", "default")
    if source in ("user", "project"):
        assert where == str(tmp_path / source / "subagents.toml")
    else:
        assert where == source


def test_tables_merge_entry_by_entry_and_every_key_reports_its_source(tmp_path: Path) -> None:
    user = """
max_active_subagents = 3
[permissions]
run_command = "allow"
write_file = "deny"
[budget]
max_turns = 10
[mcp_servers.docs]
command = "docs-server"
args = ["--stdio"]
"""
    project = """
workspace = "src"
[tools]
disabled = ["run_command"]
[permissions]
write_file = "ask"
"mcp__*" = "deny"
default = "ask"
[budget]
deadline_seconds = 90
[mcp_servers.web]
url = "http://127.0.0.1:9/mcp"
headers = {Authorization = "Bearer x"}
call_timeout = 5
"""
    config = load(tmp_path, user, project, max_depth=3)
    u, p = str(tmp_path / "user" / "subagents.toml"), str(tmp_path / "project" / "subagents.toml")
    assert config.permissions == {"run_command": "allow", "write_file": "ask", "mcp__*": "deny"}
    assert config.default_permission == "ask"
    assert config.budget == {"max_turns": 10, "deadline_seconds": 90.0}
    assert sorted(config.mcp_servers) == ["docs", "web"]
    assert config.mcp_servers["docs"].args == ("--stdio",)
    assert (
        config.mcp_servers["web"].headers == {"Authorization": "Bearer x"}
        and config.mcp_servers["web"].call_timeout == 5
    )
    assert config.disabled_tools == ("run_command",) and config.workspace == "src"
    rows = {key: (value, source) for key, value, source in config.rows()}
    assert rows["max_depth"] == (3, "flag --max-depth")
    assert rows["max_active_subagents"] == (3, u)
    assert rows["workspace"] == ("src", p)
    assert rows["max_steps"] == (64, "default")
    assert rows["permissions.run_command"] == ("allow", u)
    assert rows["permissions.write_file"] == ("ask", p)
    assert rows["permissions.default"] == ("ask", p)
    assert rows["budget.max_turns"] == (10, u)
    assert rows["mcp_servers.docs"] == ("docs-server --stdio", u)
    assert rows["mcp_servers.web"] == ("http://127.0.0.1:9/mcp", p)
    assert config.files == (u, p)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("modle = 'x'", "unknown key modle"),
        ("on_interrupted_turn = 'retry'", 'on_interrupted_turn must be "continue" or "close", got \'retry\''),
        ("max_depth = 'deep'", "max_depth must be an integer >= 0, got 'deep'"),
        ("max_depth = true", "max_depth must be an integer >= 0, got True"),
        ("max_active_subagents = 0", "max_active_subagents must be an integer >= 1, got 0"),
        ("stall_timeout = -1", "stall_timeout must be a number of seconds > 0, got -1"),
        ("stall_timeout = nan", "stall_timeout must be a number of seconds > 0, got nan"),
        ("model = ''", "model must be a non-empty string, got ''"),
        ("tools = 1", "tools must be a table ([tools]), got 1"),
        ("[tools]\nworkspace = 'yes'", "tools.workspace must be true or false, got 'yes'"),
        ("[tools]\nfancy = true", "unknown key tools.fancy"),
        ("[permissions]\nread_file = 'sometimes'", "permissions.read_file must be allow, ask or deny, got 'sometimes'"),
        ("[budget]\nmax_turns = 0", "budget.max_turns must be an integer >= 1, got 0"),
        ("[budget]\nmax_money = 1", "unknown key budget.max_money"),
        ("[mcp_servers.x]\nargs = []", "mcp_servers.x needs either command (stdio) or url (streamable HTTP)"),
        ("[mcp_servers.x]\ncommand = 'a'\nurl = 'b'", "mcp_servers.x needs either command (stdio) or url"),
        ("[mcp_servers.x]\ncommand = 'a'\nargs = 'b'", "mcp_servers.x.args must be a list of strings"),
        ("[mcp_servers.x]\ncommand = 'a'\nport = 1", "unknown key mcp_servers.x.port"),
        ("[mcp_servers.a__b]\ncommand = 'a'", "must be letters, digits, '_' or '-', without '__'"),
        (
            "[mcp_servers.x]\ncommand = 'a'\ncall_timeout = 0",
            "mcp_servers.x.call_timeout must be a number of seconds > 0",
        ),
        ("mcp_servers = {x = 1}", "mcp_servers.x must be a table, got 1"),
        ("max_depth = ", "not valid TOML"),
        ("[store]\nlease_ttl = 0", "store.lease_ttl must be a number of seconds > 0, got 0"),
        ("stall_after = 0", "stall_after must be a number of seconds > 0, got 0"),
        ("stall_after = '5m'", "stall_after must be a number of seconds > 0, got '5m'"),
        ("[store]\nlease = 1", "unknown key store.lease"),
    ],
)
def test_a_bad_file_is_one_clear_error_naming_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        load(tmp_path, project=text)
    assert str(caught.value).startswith(str(tmp_path / "project" / "subagents.toml") + ": ")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value, UsageError)  # the CLI's exit status 2


def test_a_bad_flag_value_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigInvalid, match="^--max-depth: max_depth must be an integer >= 0, got -1$"):
        load(tmp_path, max_depth=-1)


def test_unreadable_and_binary_files_are_errors_too(tmp_path: Path) -> None:
    project_dir, env = setup(tmp_path)
    (project_dir / "subagents.toml").write_bytes(b"model = '\xff'")
    with pytest.raises(ConfigInvalid, match="not valid TOML|not UTF-8"):
        load_config(str(project_dir), env=env)
    (project_dir / "subagents.toml").unlink()
    (project_dir / "subagents.toml").mkdir()
    with pytest.raises(ConfigInvalid, match="is a folder, not a file"):
        load_config(str(project_dir), env=env)


def test_the_store_table_sets_the_lease_timing(tmp_path: Path) -> None:
    config = load(tmp_path, project="[store]\nlease_ttl = 2\nlease_renew_interval = 0.5")
    assert (config.lease_ttl, config.lease_renew_interval) == (2.0, 0.5)
    assert config.sources["store.lease_ttl"] == str(tmp_path / "project" / "subagents.toml")
    (tmp_path / "other").mkdir()
    default = load(tmp_path / "other")
    assert (default.lease_ttl, default.lease_renew_interval) == (15.0, None)


def test_a_compaction_threshold_reaches_the_agents_compaction_policy(tmp_path: Path) -> None:
    """`compaction_threshold` builds the agents' policy (it once built it positionally, a
    `TypeError` in every host that read such a file)."""
    from subagents.runtime.hosts.setup import host_setup

    project_dir, env = setup(tmp_path, project="compaction_threshold = 5000")
    options = host_setup({}, project_dir=str(project_dir), env={**env, "DEEPSEEK_API_KEY": "k"}).runtime_options()
    assert options["agent_config"].compaction.max_chars == 5000
