"""The runtime's test bed (as `subagents.storage.testing` holds the storage doubles): never
imported by the product code above the models, which only resolves a `scripted:PATH` model
spec to it.

- `ScriptedModel`, the keyless model that answers from a script (docs/scripts.md), with
  `load_script` and the script's types (`Script`, `ScriptEntry`, `ScriptedResponse`, …);
  `ScriptWaits` is what a test driving it directly may give `bind` to hold `wait_for` on.
- The scenario runner (the golden runs under scenarios/): `run_scenario`, `check_scenario`,
  `update_scenario`, `scenario_dirs`, `normalize_log`.
- The error branch of both, `ScriptError` (a script that does not load; `ScriptUnreadable`,
  one that cannot be read) and the scripted
  model's `ModelError`s; they live in `subagents.runtime.foundation.errors` with the whole tree.

The names load on first use (module `__getattr__`, one table): importing the scripted model does
not import the scenario runner, which opens runtimes.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..foundation.errors import ScriptedFailure as ScriptedFailure
    from ..foundation.errors import ScriptError as ScriptError
    from ..foundation.errors import ScriptExhausted as ScriptExhausted
    from ..foundation.errors import ScriptNoAgent as ScriptNoAgent
    from ..foundation.errors import ScriptNoMatch as ScriptNoMatch
    from ..foundation.errors import ScriptNoWaits as ScriptNoWaits
    from ..foundation.errors import ScriptStalled as ScriptStalled
    from ..foundation.errors import ScriptUnreadable as ScriptUnreadable
    from ..foundation.errors import ScriptWaitUnavailable as ScriptWaitUnavailable
    from .scenario import check_scenario as check_scenario
    from .scenario import normalize_log as normalize_log
    from .scenario import run_scenario as run_scenario
    from .scenario import scenario_dirs as scenario_dirs
    from .scenario import update_scenario as update_scenario
    from .script_format import Script as Script
    from .script_format import ScriptedError as ScriptedError
    from .script_format import ScriptedResponse as ScriptedResponse
    from .script_format import ScriptedToolCall as ScriptedToolCall
    from .script_format import ScriptEntry as ScriptEntry
    from .script_format import WaitFor as WaitFor
    from .script_format import WaitForSettled as WaitForSettled
    from .script_format import WaitForSteered as WaitForSteered
    from .script_format import WaitForWaiting as WaitForWaiting
    from .script_format import load_script as load_script
    from .script_waits import ScriptWaits as ScriptWaits
    from .scripted_model import DEFAULT_STALL_TIMEOUT as DEFAULT_STALL_TIMEOUT
    from .scripted_model import ScriptedModel as ScriptedModel
    from .scripted_model import ScriptedModelStatistics as ScriptedModelStatistics

# Each name and the module it loads from: the one table (a test keeps the imports above in step).
_WHERE: dict[str, str] = {
    "ScriptedFailure": "..foundation.errors",
    "ScriptError": "..foundation.errors",
    "ScriptExhausted": "..foundation.errors",
    "ScriptNoAgent": "..foundation.errors",
    "ScriptNoMatch": "..foundation.errors",
    "ScriptNoWaits": "..foundation.errors",
    "ScriptStalled": "..foundation.errors",
    "ScriptUnreadable": "..foundation.errors",
    "ScriptWaitUnavailable": "..foundation.errors",
    "check_scenario": ".scenario",
    "normalize_log": ".scenario",
    "run_scenario": ".scenario",
    "scenario_dirs": ".scenario",
    "update_scenario": ".scenario",
    "Script": ".script_format",
    "ScriptedError": ".script_format",
    "ScriptedResponse": ".script_format",
    "ScriptedToolCall": ".script_format",
    "ScriptEntry": ".script_format",
    "WaitFor": ".script_format",
    "WaitForSettled": ".script_format",
    "WaitForSteered": ".script_format",
    "WaitForWaiting": ".script_format",
    "load_script": ".script_format",
    "ScriptWaits": ".script_waits",
    "DEFAULT_STALL_TIMEOUT": ".scripted_model",
    "ScriptedModel": ".scripted_model",
    "ScriptedModelStatistics": ".scripted_model",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """Load a name from its submodule on first use, then keep it here."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
