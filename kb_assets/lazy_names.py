"""A package's names loaded from its submodules on first use (PEP 562), for packages whose importers often need
one light helper of many (kb_assets.query, kb_assets.chunking): importing the package then costs only what the
caller touches."""
from __future__ import annotations

import sys
from importlib import import_module
from typing import Any, Callable


def lazy_names(package: str, homes: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(`__getattr__`, `__dir__`) for `package`: a name of `homes` (name -> submodule) is imported from
    `package.<submodule>` the first time it is asked for, then kept in the package's namespace."""
    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{home}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(homes))

    return __getattr__, __dir__
