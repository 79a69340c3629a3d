"""The reference's import path for version comparisons: ``accelerando.utils.versions``.

Both functions live in :mod:`accelerando.common.imports`; this module re-exports them.
"""

from __future__ import annotations

from accelerando.common.imports import compare_versions, is_torch_version

__all__ = ["compare_versions", "is_torch_version"]
