"""The reference's import path for the main-process progress bar: ``accelerando.utils.tqdm``.

The bar itself is :func:`accelerando.utils.progress.tqdm`. In the reference, ``accelerate.utils.tqdm``
names the function although a submodule has the same name; here the module is also callable (it
calls the function), so ``accelerando.utils.tqdm(range(3))`` works whichever of the two a lookup
finds first.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from accelerando.utils.progress import tqdm

__all__ = ["tqdm"]


class _CallableModule(types.ModuleType):
    """A module that, called, builds a progress bar (the module stands in for its function)."""

    def __call__(self, *args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
        return tqdm(*args, main_process_only=main_process_only, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
