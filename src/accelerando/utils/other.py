"""The reference's import path ``accelerate.utils.other``.

Re-exports from :mod:`accelerando.common.other` and :mod:`accelerando.big_modeling.tensors`.
"""

from __future__ import annotations

from accelerando.big_modeling.tensors import get_module_children_bottom_up
from accelerando.common.other import *  # noqa: F403 (the owner's __all__ is this module's)
from accelerando.common.other import __all__ as _common_all

__all__ = [*_common_all, "get_module_children_bottom_up"]
