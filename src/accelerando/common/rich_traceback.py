"""Importing this module makes uncaught exceptions print as rich tracebacks (the rich package).

What the reference's ``accelerate.utils.rich`` path does on import (``accelerando.utils.rich``
imports this module). A launched process imports it at start when ``ACCELERATE_ENABLE_RICH`` is
true; ``import accelerando`` never does.

Raises:
    ModuleNotFoundError: on import, when rich is not installed (``pip install rich``).
"""

from __future__ import annotations

from accelerando.common.imports import is_rich_available

__all__: list[str] = []

if not is_rich_available():
    raise ModuleNotFoundError("accelerando.utils.rich needs the rich package: pip install rich")


def _install() -> None:
    from rich.traceback import install

    install(show_locals=False)


_install()
