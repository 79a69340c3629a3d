"""Lazy attribute resolution for public namespaces (PEP 562).

A public module lists ``name -> defining module`` once; the defining module is imported the first
time the name is read. This keeps ``import accelerando`` light: nothing beyond torch is imported
until a name is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any


def lazy_getattr(
    namespace: str,
    exports: Mapping[str, str],
    module_globals: dict[str, object],
    submodules: bool = False,
) -> Callable[[str], Any]:
    """Build a module-level ``__getattr__`` that imports each exported name on first access.

    Args:
        namespace: the public module's ``__name__`` (used in error messages).
        exports: maps each public name to the absolute module that defines it.
        module_globals: the public module's ``globals()``; resolved names are cached there so the
            import happens once.
        submodules: also hand out the package's submodules as attributes on first access
            (``import accelerando; accelerando.utils.set_seed(0)``), as a regular import would.

    Returns:
        A function suitable as the module's ``__getattr__``.

    Raises:
        AttributeError (from the returned function): for a name that is not exported.
    """

    def __getattr__(name: str) -> Any:
        target = exports.get(name)
        if target is None:
            if submodules and name.isidentifier() and not name.startswith("__"):
                return _submodule(name)
            raise AttributeError(f"module {namespace!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(target), name)
        module_globals[name] = value
        return value

    def _submodule(name: str) -> ModuleType:
        full = f"{namespace}.{name}"
        try:
            module = importlib.import_module(full)
        except ModuleNotFoundError as error:
            if error.name != full:
                raise  # the submodule exists but something it imports is missing: say that
            raise AttributeError(f"module {namespace!r} has no attribute {name!r}") from None
        module_globals[name] = module
        return module

    return __getattr__


def lazy_dir(names: list[str]) -> Callable[[], list[str]]:
    """Build a module-level ``__dir__`` listing a lazily resolved namespace's public names.

    Args:
        names: the namespace's ``__all__``.

    Returns:
        A function suitable as the module's ``__dir__``; it returns the names sorted.
    """

    def __dir__() -> list[str]:
        return sorted(names)

    return __dir__
