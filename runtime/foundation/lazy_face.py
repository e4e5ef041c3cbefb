"""The loader behind the runtime's lazy faces (`subagents.runtime`, `subagents.runtime.testing`):
a face lists each name with the submodule that defines it, once, and the name is imported on
first use and then kept in the face, so importing one part never loads the rest (start-up)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_face"]


def lazy_face(
    package: str, where: Mapping[str, str], namespace: MutableMapping[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module `__getattr__` and `__dir__` of the face `package` (whose globals are
    `namespace`): `where` maps each name to the relative submodule it loads from."""

    def getattr_(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module, package), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *where})

    return getattr_, dir_
