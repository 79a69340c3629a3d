"""The reference's import path for the main-process progress bar: ``accelerate.utils.tqdm``.

Re-exports :func:`accelerando.common.progress.tqdm`. The module is also callable (it calls the
function; see :class:`~accelerando.common.progress.CallableProgressModule`), so
``accelerando.utils.tqdm(range(3))`` works whichever of the module and the function a lookup finds.
"""

from __future__ import annotations

import sys

from accelerando.common.progress import CallableProgressModule, tqdm

__all__ = ["tqdm"]

sys.modules[__name__].__class__ = CallableProgressModule
