"""The runtime's test bed, as `subagents.storage.testing` holds the storage doubles: the product
reaches it only where a host asks for it (a `scripted:PATH` model spec, the demo).

- `ScriptedModel`, the keyless model that answers from a script (docs/scripts.md), with
  `load_script` (the script's types stay in `script_format`, for the tests of the format);
  `ScriptWaits` is what a test driving it directly may give `bind` to hold `wait_for` on;
  `DEFAULT_STALL_TIMEOUT`, how long a scripted wait goes without progress before it fails.
- The scenario runner (the golden runs under scenarios/): `run_scenario`, `check_scenario`,
  `update_scenario`, `scenario_dirs`.

Their error branch (`ScriptError`, a script that does not load, and the scripted model's
`ModelError`s: `ScriptedFailure`, `ScriptExhausted`, `ScriptNoAgent`, `ScriptNoMatch`,
`ScriptNoWaits`, `ScriptWaitUnavailable`, `ScriptStalled`) lives with the whole tree in
`subagents.runtime.foundation.errors`, its one import path (tests/test_error_tree.py).

The names load on first use (module `__getattr__`, one table): importing the scripted model does
not import the scenario runner, which opens runtimes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..foundation.lazy_face import lazy_face

if TYPE_CHECKING:
    from .scenario import check_scenario as check_scenario
    from .scenario import run_scenario as run_scenario
    from .scenario import scenario_dirs as scenario_dirs
    from .scenario import update_scenario as update_scenario
    from .script_format import load_script as load_script
    from .script_waits import ScriptWaits as ScriptWaits
    from .scripted_model import DEFAULT_STALL_TIMEOUT as DEFAULT_STALL_TIMEOUT
    from .scripted_model import ScriptedModel as ScriptedModel

# Each name and the module it loads from: the one table (a test keeps the imports above in step).
_WHERE: dict[str, str] = {
    "check_scenario": ".scenario",
    "run_scenario": ".scenario",
    "scenario_dirs": ".scenario",
    "update_scenario": ".scenario",
    "load_script": ".script_format",
    "ScriptWaits": ".script_waits",
    "DEFAULT_STALL_TIMEOUT": ".scripted_model",
    "ScriptedModel": ".scripted_model",
}

__all__ = sorted(_WHERE)


__getattr__, __dir__ = lazy_face(__name__, _WHERE, globals())
