"""The reference's import path ``accelerate.utils.constants``.

Re-exports from :mod:`accelerando.common.constants`.
"""

from __future__ import annotations

from accelerando.common.constants import *  # noqa: F403 (the owner's __all__ is this module's)
from accelerando.common.constants import __all__  # noqa: F401
