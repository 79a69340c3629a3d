"""The reference's import path ``accelerate.utils.rich``: importing it installs rich tracebacks.

The work is done by :mod:`accelerando.common.rich_traceback`, imported here.

Raises:
    ModuleNotFoundError: on import, when rich is not installed (``pip install rich``).
"""

from __future__ import annotations

import accelerando.common.rich_traceback  # noqa: F401 (importing it installs the tracebacks)

__all__: list[str] = []
