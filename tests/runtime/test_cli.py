"""The console script exists and says what it is; unknown input is a clear error, not a traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from subagents.runtime.cli import main


def test_help_names_the_product(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "durable background subagents" in out
    assert "--root" in out


def test_console_script_is_installed() -> None:
    exe = shutil.which("subagents", path=str(Path(sys.executable).parent))
    assert exe is not None
    done = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "usage: subagents" in done.stdout


def test_unknown_option_is_exit_2_without_traceback(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--no-such-option"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --no-such-option" in err
    assert "Traceback" not in err
