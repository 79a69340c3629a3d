"""The reference's import path ``accelerate.utils.imports``.

Re-exports from :mod:`accelerando.common.imports`.
"""

from __future__ import annotations

from accelerando.common.imports import *  # noqa: F403 (the owner's __all__ is this module's)
from accelerando.common.imports import __all__  # noqa: F401
