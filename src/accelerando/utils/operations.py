"""The reference's import path ``accelerate.utils.operations``.

Re-exports from :mod:`accelerando.common.operations`.
"""

from __future__ import annotations

from accelerando.common.operations import *  # noqa: F403 (the owner's __all__ is this module's)
from accelerando.common.operations import __all__  # noqa: F401
