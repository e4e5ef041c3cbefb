"""`run_command` in the bubblewrap sandbox (issue 32; README "Sandbox"), with the real `bwrap`.

Each attempt to get out runs as an agent's command would, through the tool, with a fake HOME
(its `.ssh` holding a key) and an environment carrying a model API key; the store's root sits
beside the workspace. What the box must refuse fails inside the command or finds nothing, and
nothing outside the workspace changes (a snapshot of the whole test folder, before and after).
The test folders live in /var/tmp, not pytest's /tmp: the box's /tmp is private, so a tree under
/tmp would be hidden whole and prove nothing about the rest of the file system.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing
from subagents.actors import Abort
from subagents.runtime.sandbox.box import Sandbox
from subagents.runtime.sandbox.policy import SandboxPolicy
from subagents.runtime.tools.base import ToolContext, ToolOutcome, ToolSet
from subagents.runtime.tools.workspace_tools import workspace_tools

from .test_workspace_tools import gone, snapshot

BWRAP = shutil.which("bwrap")
# Installed by ./dev test and .ci/run (apt) where missing: a machine without it fails loudly here.
assert BWRAP is not None, "bubblewrap (bwrap) is not installed: ./dev test installs it"


class Box:
    """A workspace, a store root and a fake HOME in `folder`, and the tools in a sandbox."""

    def __init__(
        self,
        folder: Path,
        policy: SandboxPolicy | None = None,
        *,
        path: str | None = None,
        by_type: dict[str, SandboxPolicy] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.tmp = folder
        self.ws = folder / "ws"
        self.ws.mkdir()
        self.store = folder / "store"
        self.store.mkdir()
        (self.store / "index.sqlite3").write_bytes(b"SQLite format 3\0 the store's index")
        self.home = folder / "home"
        (self.home / ".ssh").mkdir(parents=True)
        (self.home / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
        (self.home / "notes.txt").write_text("readable\n")
        given = env or {}
        env = {
            **given,
            "PATH": path if path is not None else os.environ["PATH"],
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "OPENAI_API_KEY": "sk-test-openai",
            "ANTHROPIC_API_KEY": "sk-ant-test",
            "GITHUB_TOKEN": "ghp_test",
            "CC": "gcc",
        }
        self.sandbox = Sandbox(policy or SandboxPolicy(), hidden=[str(self.store)], env=env, by_type=by_type)
        self.tools = ToolSet(workspace_tools(str(self.ws), sandbox=self.sandbox))

    async def call(self, agent_type: str | None = None, **args: Any) -> ToolOutcome:
        # The calling agent, as far as the tool looks: the agent type in its header.
        agent = SimpleNamespace(session=SimpleNamespace(header=SimpleNamespace(agent_preset=agent_type)))
        ctx = ToolContext(session_id="s-1", call_id="call-1", turn=1, step=1, abort=Abort(), agent=agent)
        return await self.tools.execute("run_command", json.dumps(args), ctx)

    async def run(self, command: str | list[str], agent_type: str | None = None, **args: Any) -> tuple[int, str]:
        """The exit code and output of a command that ran in the box."""
        outcome = await self.call(agent_type, command=command, **args)
        assert not outcome.is_error, outcome.content
        text = outcome.content[0]["text"]
        first, _, output = text.partition("\n")
        assert " (sandboxed: workspace writable, network o" in first, first
        return int(first.split()[2]), output


@pytest.fixture
def base() -> Iterator[Path]:
    """A fresh folder outside /tmp (see the module's docstring)."""
    folder = Path(tempfile.mkdtemp(prefix="sandbox-test-", dir="/var/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


@pytest.fixture
def box(base: Path) -> Iterator[Box]:
    made = Box(base)
    before = snapshot(base)
    yield made
    # Whatever a test's commands tried, outside the workspace nothing changed.
    after = {k: v for k, v in snapshot(base).items() if not k.startswith(str(made.ws))}
    assert after == {k: v for k, v in before.items() if not k.startswith(str(made.ws))}


async def test_a_build_like_command_works_inside(box: Box) -> None:
    script = (
        "mkdir -p build && printf 'print(6 * 7)\\n' > build/main.py && python3 build/main.py > build/out.txt"
        " && cat build/out.txt && python3 -c 'import ssl, sqlite3; print(ssl.OPENSSL_VERSION_NUMBER > 0)'"
        " && ls /usr/lib > /dev/null && echo libs && echo tmp > /tmp/scratch && cat /tmp/scratch"
    )
    code, output = await box.run(script)
    assert (code, output) == (0, "42\nTrue\nlibs\ntmp")
    assert (box.ws / "build" / "out.txt").read_text() == "42\n"
    assert await box.run(["python3", "-c", "import os; print(os.getcwd())"], cwd="build") == (0, f"{box.ws}/build")


async def test_writes_outside_the_workspace_fail_and_change_nothing(box: Box) -> None:
    # The fixture's snapshot checks that nothing outside the workspace changed.
    for target in (box.tmp / "new.txt", box.home / "notes.txt", box.store / "index.sqlite3", Path("/etc/sandbox-t")):
        code, output = await box.run(f"echo x >> {target}")
        assert code != 0, target
        assert "Read-only file system" in output or "No such file or directory" in output, output
    code, output = await box.run(f"rm -rf {box.home}/notes.txt")
    assert code != 0 and "Read-only file system" in output
    assert (box.home / "notes.txt").read_text() == "readable\n"


async def test_secrets_are_hidden(box: Box) -> None:
    assert await box.run(f"ls -A {box.home}/.ssh; cat {box.home}/.ssh/id_ed25519") != (0, "")
    code, output = await box.run(f"ls -A {box.home}/.ssh | wc -l; ls -A {box.store} | wc -l")
    assert (code, output) == (0, "0\n0")  # the folders are there, empty
    code, output = await box.run(f"cat {box.store}/index.sqlite3")
    assert code != 0 and "No such file or directory" in output
    assert await box.run(f"cat {box.home}/notes.txt") == (0, "readable")  # the rest of HOME is readable


async def test_the_command_has_no_capabilities_to_undo_its_mounts(box: Box) -> None:
    # Run by root, bwrap keeps every capability inside unless told to drop them: the command
    # could unmount what hides a secret, or remount `/` writable and write to the host's disk.
    # The fixture's snapshot checks that nothing outside the workspace changed.
    code, output = await box.run(
        f"grep CapEff /proc/self/status; umount {box.store}; cat {box.store}/index.sqlite3;"
        f" umount {box.home}/.ssh; cat {box.home}/.ssh/id_ed25519;"
        f" mount -o remount,bind,rw / && touch {box.tmp}/escaped; mount -t tmpfs none {box.home}"
    )
    assert output.splitlines()[0] == "CapEff:\t0000000000000000", output
    assert "SQLite" not in output and "PRIVATE KEY" not in output, output
    assert not (box.tmp / "escaped").exists()


async def test_without_home_in_the_environment_the_accounts_home_is_still_hidden(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A service started without HOME (a root systemd unit): the secrets are where the account's
    # home folder is, whatever the environment says.
    home = base / "account"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: SimpleNamespace(pw_dir=str(home)))
    (base / "ws").mkdir()
    sandbox = Sandbox(SandboxPolicy(), env={"PATH": os.environ["PATH"]})
    tools = ToolSet(workspace_tools(str(base / "ws"), sandbox=sandbox))
    ctx = ToolContext(session_id="s-1", call_id="call-1", turn=1, step=1, abort=Abort())
    command = json.dumps({"command": f"cat {home}/.ssh/id_ed25519; ls -A {home}/.ssh | wc -l"})
    outcome = await tools.execute("run_command", command, ctx)
    assert outcome.content[0]["text"].splitlines()[1:] == [
        f"cat: {home}/.ssh/id_ed25519: No such file or directory",
        "0",
    ], outcome.content


CREDENTIALS = (
    ".git-credentials",  # `git credential-store`: tokens in plain text
    ".pypirc",
    ".pgpass",
    ".my.cnf",
    ".vault-token",
    ".cargo/credentials.toml",
    ".config/gcloud/credentials.db",
    ".azure/msal_token_cache.json",
    ".password-store/x.gpg",
    ".local/share/keyrings/login.keyring",
    ".terraform.d/credentials.tfrc.json",
    ".config/hub",
)


async def test_the_usual_credential_files_are_hidden(base: Path) -> None:
    box = Box(base)
    for name in CREDENTIALS:
        (box.home / name).parent.mkdir(parents=True, exist_ok=True)
        (box.home / name).write_text("TOKEN-SENTINEL\n")
    code, output = await box.run(" ; ".join(f"cat ~/{name} 2>/dev/null" for name in CREDENTIALS))
    assert "TOKEN-SENTINEL" not in output, output
    assert await box.run("cat ~/notes.txt") == (0, "readable")


async def test_the_credential_files_our_environment_names_are_hidden(base: Path) -> None:
    # The variable is removed (its name says credential) or kept (KUBECONFIG), the file would stay.
    keys = base / "keys"
    keys.mkdir()
    named = {
        "GOOGLE_APPLICATION_CREDENTIALS": "sa.json",
        "AWS_SHARED_CREDENTIALS_FILE": "aws",
        "PGPASSFILE": "pgpass",
        "NETRC": "netrc",
        "KUBECONFIG": "kube-a:{keys}/kube-b",
        "DOCKER_CONFIG": "docker",
        "CLOUDSDK_CONFIG": "gcloud",
    }
    env = {name: f"{keys}/{value.format(keys=keys)}" for name, value in named.items()}
    for name in ("sa.json", "aws", "pgpass", "netrc", "kube-a", "kube-b"):
        (keys / name).write_text("TOKEN-SENTINEL\n")
    for name in ("docker", "gcloud"):
        (keys / name).mkdir()
        (keys / name / "config.json").write_text("TOKEN-SENTINEL\n")
    made = Box(base, env=env)
    code, output = await made.run(f"cat {keys}/* {keys}/*/* 2>&1; ls {keys}")
    assert "TOKEN-SENTINEL" not in output, output
    assert "kube-b" in output  # the folder around them stays readable


async def test_the_environment_carries_no_keys(box: Box) -> None:
    code, output = await box.run('echo "[$OPENAI_API_KEY][$ANTHROPIC_API_KEY][$GITHUB_TOKEN][$CC][$LANG]"; env')
    assert code == 0
    assert output.splitlines()[0] == "[][][][gcc][C.UTF-8]"
    assert "sk-" not in output and "ghp_" not in output
    assert f"HOME={box.home}" in output


def _listener() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)  # the kernel completes connections from its backlog: no accept needed
    return server, server.getsockname()[1]


_CONNECT = (
    "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5); print('connected')"
)


async def test_the_network_is_off_loopback_included(box: Box) -> None:
    server, port = _listener()
    with server:
        code, output = await box.run(["python3", "-c", _CONNECT, str(port)])
    assert code == 1
    assert "ConnectionRefusedError" in output or "Network is unreachable" in output, output


async def test_the_network_is_on_when_allowed(base: Path) -> None:
    # The control of the test above: the same connection from a box that allows the network.
    open_box = Box(base, SandboxPolicy(network=True))
    server, port = _listener()
    with server:
        code, output = await open_box.run(["python3", "-c", _CONNECT, str(port)])
    assert (code, output) == (0, "connected")


async def test_an_agent_type_may_open_the_network_for_its_agents(base: Path) -> None:
    typed = Box(base, by_type={"fetcher": SandboxPolicy(network=True)})
    server, port = _listener()
    with server:
        assert await typed.run(["python3", "-c", _CONNECT, str(port)], "fetcher") == (0, "connected")
        code, _ = await typed.run(["python3", "-c", _CONNECT, str(port)], "other")
    assert code == 1  # any other agent's box has no network


def _pids_running(marker: str) -> list[int]:
    """The processes whose command line holds `marker` (seen from outside the box)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue  # it ended while we looked
    return found


async def test_a_process_that_outlives_the_command_is_gone(box: Box) -> None:
    marker = f"{os.getpid()}7654"
    # Unconfined, the sleep would live on (its output goes nowhere, so the command returns).
    assert await box.run(f"sleep {marker} > /dev/null 2>&1 & echo started") == (0, "started")
    # bwrap returns the command's status as soon as it has it; the kernel kills what is left in
    # the box's PID namespace a moment later, as its first process ends (gone: waits on a pidfd).
    left = await trio.to_thread.run_sync(_pids_running, marker)
    assert await trio.to_thread.run_sync(lambda: all(gone(pid) for pid in left))


def test_a_timeout_kills_the_whole_tree(base: Path) -> None:
    made = Box(base)
    marker = f"{os.getpid()}8765"
    fifo = made.ws / "ready"
    os.mkfifo(fifo)  # the workspace is bound into the box: the fifo works across
    clock = trio.testing.MockClock()
    command = f"sleep {marker} & sleep {marker} & echo ready > {fifo}; wait"

    async def main() -> tuple[ToolOutcome, list[int]]:
        outcome: list[ToolOutcome] = []

        async def call() -> None:
            outcome.append(await made.call(command=command, timeout_seconds=5))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await trio.to_thread.run_sync(fifo.read_text)  # both sleeps have started
            # The whole tree, seen from here by the marker in its command lines (bwrap's, the
            # shell's, the two forks', exec'd into sleep or not yet); PIDs inside the box mean
            # nothing here.
            sleepers = await trio.to_thread.run_sync(_pids_running, marker)
            clock.autojump_threshold = 0  # then time jumps to the tool's timeout
        return outcome[0], sleepers

    outcome, sleepers = trio.run(main, clock=clock)
    assert outcome.is_error and outcome.error == {"name": "ToolFailure", "code": "COMMAND_TIMEOUT"}
    assert "killed (sandboxed: " in outcome.content[0]["text"]
    assert len(sleepers) >= 4, sleepers  # bwrap (here: and its PID 1), the shell, the two sleeps
    assert all(gone(pid) for pid in sleepers)


async def test_without_bwrap_on_path_the_result_says_so_and_nothing_runs(base: Path) -> None:
    made = Box(base, path=str(base / "empty-bin"))
    outcome = await made.call(command=f"touch {made.ws}/ran")
    assert outcome.is_error and outcome.error == {"name": "ToolFailure", "code": "SANDBOX_UNAVAILABLE"}
    text = outcome.content[0]["text"]
    assert "the sandbox is on but bwrap (bubblewrap) is not on PATH" in text
    assert "apt-get install bubblewrap" in text and 'mode = "off"' in text
    assert not (made.ws / "ran").exists()  # never a silent fallback to running unconfined


async def test_the_probe_runs_once_per_sandbox(base: Path) -> None:
    made = Box(base)
    first = await made.sandbox.probe()
    assert first.works and first.bwrap == BWRAP
    assert await made.sandbox.probe() is first  # kept: the next command does not probe again
    (base / "other").mkdir()
    other = Box(base / "other")
    assert await other.sandbox.probe() is not first  # each runtime's sandbox probes for itself


async def test_a_workspace_under_the_hidden_root_stays_writable(base: Path) -> None:
    # As in tests, and in a project whose workspace holds its `.subagents` root: the nested
    # mounts go in depth order, so the workspace shows through a hidden parent and a hidden
    # child stays hidden inside the workspace.
    root = base / "root"
    ws = root / "ws"
    (ws / ".subagents").mkdir(parents=True)
    (ws / ".subagents" / "index.sqlite3").write_text("index")
    env = {"PATH": os.environ["PATH"], "HOME": str(base)}
    sandbox = Sandbox(SandboxPolicy(), hidden=[str(root), str(ws / ".subagents")], env=env)
    tools = ToolSet(workspace_tools(str(ws), sandbox=sandbox))
    ctx = ToolContext(session_id="s-1", call_id="call-1", turn=1, step=1, abort=Abort())
    command = "echo made > f && cat f && ls -A .subagents | wc -l && ls -A .. "
    outcome = await tools.execute("run_command", json.dumps({"command": command}), ctx)
    assert outcome.content[0]["text"].splitlines()[1:] == ["made", "0", "ws"]
    assert (ws / "f").read_text() == "made\n"
    assert (ws / ".subagents" / "index.sqlite3").read_text() == "index"


async def test_a_workspace_that_is_the_hidden_root_is_refused(base: Path) -> None:
    # `--root .` in the project: the workspace's writable bind would uncover the store (its logs,
    # `index.sqlite3`) for commands to read and rewrite; so would a workspace at `~/.ssh`.
    root = base / "root"
    root.mkdir()
    (root / "index.sqlite3").write_text("index")
    (base / ".ssh").mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(base)}
    sandbox = Sandbox(SandboxPolicy(), hidden=[str(root)], env=env)
    ctx = ToolContext(session_id="s-1", call_id="call-1", turn=1, step=1, abort=Abort())
    for ws in (root, base / ".ssh"):
        tools = ToolSet(workspace_tools(str(ws), sandbox=sandbox))
        command = json.dumps({"command": "cat index.sqlite3; echo forged > index.sqlite3; echo ran > ran"})
        outcome = await tools.execute("run_command", command, ctx)
        assert outcome.error == {"name": "ToolFailure", "code": "SANDBOX_REFUSED"}, outcome.content
        assert f"the workspace {ws} is hidden" in outcome.content[0]["text"], outcome.content
        assert not (ws / "ran").exists()
    assert (root / "index.sqlite3").read_text() == "index"


async def test_extra_writable_folders_and_hidden_paths(base: Path) -> None:
    cache = base / "cache"
    cache.mkdir()
    private = base / "private.txt"
    private.write_text("private\n")
    made = Box(base, SandboxPolicy(writable=[str(cache)], readable_hidden=[str(private)]))
    code, output = await made.run(f"echo hit > {cache}/x && cat {private}")
    assert code == 1 and output == f"cat: {private}: Permission denied"  # /dev/null covers it
    assert (cache / "x").read_text() == "hit\n"
    assert private.read_text() == "private\n"


async def test_a_writable_folder_a_command_turns_into_a_symlink_is_refused(base: Path) -> None:
    # `writable = ["build"]` is from the workspace, which the box writes: a command that makes
    # `build` a symlink must not have the next command's box bind its target writable (HOME's
    # start-up files, the store's root, `/` itself with the host's /dev).
    made = Box(base, SandboxPolicy(writable=["build", "../cache"]))
    (base / "cache").mkdir()
    (base / "cache" / "pip").mkdir()
    assert await made.run(f"ln -s {made.home} build") == (0, "")
    for target in (made.home, made.store, Path("/")):
        (made.ws / "build").unlink()  # refused from now on: the person must mend it
        (made.ws / "build").symlink_to(target)
        outcome = await made.call(command=f"touch {made.home}/.bashrc; cat {made.store}/index.sqlite3")
        assert outcome.error == {"name": "ToolFailure", "code": "SANDBOX_REFUSED"}, outcome.content
        text = outcome.content[0]["text"]
        assert f"{made.ws}/build" in text and "symlink" in text, text
        assert not (made.home / ".bashrc").exists()
    (made.ws / "build").unlink()
    (made.ws / "build").mkdir()
    # The same under another writable folder (`../cache` is writable, `../cache/pip` too); a
    # symlink outside every writable folder is the person's own, as configured, and followed.
    (base / "inner").mkdir()
    os.symlink(base / "cache" / "pip", base / "linked")
    inner = Box(base / "inner", SandboxPolicy(writable=[f"{base}/cache", f"{base}/cache/pip", f"{base}/linked"]))
    assert await made.run(f"rm -rf ../cache/pip; ln -s {made.home} ../cache/pip") == (0, "")
    outcome = await inner.call(command="true")
    assert outcome.is_error and f"{base}/cache/pip" in outcome.content[0]["text"], outcome.content
    assert await made.run("rm ../cache/pip; mkdir ../cache/pip") == (0, "")
    assert await inner.run(f"echo ok > {base}/linked/y") == (0, "")
    assert await made.run("echo ok > build/x") == (0, "")
    assert (base / "cache" / "pip" / "y").read_text() == "ok\n"


async def test_mode_off_runs_unconfined_as_before(base: Path) -> None:
    made = Box(base, SandboxPolicy(mode="off"))
    outcome = await made.call(command=f"echo out > {base}/outside.txt")
    assert outcome.content[0]["text"] == "exit code: 0"  # no word of a sandbox
    assert (base / "outside.txt").read_text() == "out\n"
    (spec,) = [spec for spec in made.tools.specs() if spec.name == "run_command"]
    assert "unsandboxed" not in json.dumps(spec.parameters) and "sandbox" not in spec.description


async def test_a_missing_program_is_not_started_boxed_as_unboxed(base: Path) -> None:
    boxed = Box(base)
    (base / "off").mkdir()
    unboxed = Box(base / "off", SandboxPolicy(mode="off"))
    for made in (boxed, unboxed):
        outcome = await made.call(command=["no-such-program-here", "x"])
        assert outcome.is_error and outcome.error == {"name": "ToolFailure", "code": "COMMAND_NOT_STARTED"}
        assert outcome.content[0]["text"] == "Error: the command cannot start: No such file or directory"
    # A shell line is /bin/sh's to report, boxed or not: it runs, and says so with 127.
    code, output = await boxed.run("no-such-program-here")
    assert code == 127 and "not found" in output


async def test_a_program_visible_only_outside_the_box_is_not_started(base: Path) -> None:
    made = Box(base)
    tool = made.store / "tool.sh"  # under the store's root: hidden in the box
    tool.write_text("#!/bin/sh\necho ran\n")
    tool.chmod(0o755)
    outcome = await made.call(command=[str(tool)])
    assert outcome.is_error and outcome.error == {"name": "ToolFailure", "code": "COMMAND_NOT_STARTED"}
    assert f"({tool} is hidden in the sandbox)" in outcome.content[0]["text"]
    # The same program in the workspace runs, by a relative name and on the command's PATH.
    shutil.copy(tool, made.ws / "tool.sh")
    assert await made.run(["./tool.sh"]) == (0, "ran")
    (made.ws / "notes").write_text("x\n")
    outcome = await made.call(command=["./notes"])  # there, not executable: as execvp says
    assert outcome.error == {"name": "ToolFailure", "code": "COMMAND_NOT_STARTED"}
    assert outcome.content[0]["text"].endswith("Permission denied")
    (base / "second").mkdir()
    on_path = Box(base / "second", path=f"{base}/second/store:{os.environ['PATH']}")
    shutil.copy(tool, on_path.store / "tool.sh")  # found on PATH outside, hidden inside
    outcome = await on_path.call(command=["tool.sh"])
    assert outcome.error == {"name": "ToolFailure", "code": "COMMAND_NOT_STARTED"}
    assert "tool.sh is hidden in the sandbox)" in outcome.content[0]["text"]


async def test_an_agent_type_adds_writable_and_hidden_paths_for_its_agents(base: Path) -> None:
    cache = base / "cache"
    cache.mkdir()
    private = base / "home" / "private.txt"
    typed = Box(base, by_type={"builder": SandboxPolicy(type_writable=[str(cache)], readable_hidden=["~/private.txt"])})
    private.write_text("private\n")
    code, output = await typed.run(f"echo hit > {cache}/x && cat {private}", "builder")
    assert code == 1 and output == f"cat: {private}: Permission denied"
    assert (cache / "x").read_text() == "hit\n"
    code, output = await typed.run(f"cat {private}; echo other > {cache}/y", "other")
    assert code == 2 and output.startswith("private\n") and "Read-only file system" in output
    assert not (cache / "y").exists()  # any other agent's box is the runtime's


async def test_an_agent_type_cannot_make_a_secret_writable(base: Path) -> None:
    typed = Box(base, by_type={"thief": SandboxPolicy(type_writable=["~/.ssh"])})
    outcome = await typed.call("thief", command="cat ~/.ssh/id_ed25519 > stolen")
    assert outcome.is_error and outcome.error == {"name": "ToolFailure", "code": "SANDBOX_REFUSED"}
    assert "sandbox_writable '~/.ssh' is at or under the hidden" in outcome.content[0]["text"]
    assert not (typed.ws / "stolen").exists()  # nothing ran


_UNIX_CONNECT = (
    "import socket, sys\n"
    "for path in sys.argv[1:]:\n"
    "    c = socket.socket(socket.AF_UNIX)\n"
    "    try:\n"
    "        c.connect(path)\n"
    "        print('connected')\n"
    "    except OSError as exc:\n"
    "        print(type(exc).__name__)\n"
)


async def test_the_sockets_our_environment_names_are_hidden(base: Path) -> None:
    # A read-only mount does not stop connect(): each socket must be covered, or its folder.
    runtime_dir = base / "xdg"
    runtime_dir.mkdir()
    places = {
        "agent": base / "agent.sock",  # SSH_AUTH_SOCK (the variable is removed; the socket stays)
        "docker": base / "docker.sock",  # DOCKER_HOST=unix://…
        "bus": base / "bus.sock",  # DBUS_SESSION_BUS_ADDRESS=unix:path=…
        "runtime": runtime_dir / "wayland-0",  # under XDG_RUNTIME_DIR
        "elsewhere": base / "elsewhere.sock",  # named by nothing: still reachable
    }
    env = {
        "SSH_AUTH_SOCK": str(places["agent"]),
        "DOCKER_HOST": f"unix://{places['docker']}",
        "DBUS_SESSION_BUS_ADDRESS": f"unix:path={places['bus']},guid=0",
        "XDG_RUNTIME_DIR": str(runtime_dir),
    }
    made = Box(base, env=env)
    listeners = []
    for path in places.values():
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.listen()
        listeners.append(server)
    try:
        code, output = await made.run(["python3", "-c", _UNIX_CONNECT, *map(str, places.values())])
        hidden = Box(base / "ws", SandboxPolicy(readable_hidden=[str(places["elsewhere"])]))
        _, listed = await hidden.run(["python3", "-c", _UNIX_CONNECT, str(places["elsewhere"])])
    finally:
        for server in listeners:
            server.close()
    assert (code, output.splitlines()) == (
        0,
        ["ConnectionRefusedError"] * 3 + ["FileNotFoundError", "connected"],  # /dev/null over each; the folder empty
    )
    assert listed == "ConnectionRefusedError"  # readable_hidden covers a socket elsewhere
