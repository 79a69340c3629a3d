"""The reference's import path ``accelerate.utils.torch_xla``.

Re-exports from :mod:`accelerando.common.torch_xla`.
"""

from __future__ import annotations

from accelerando.common.torch_xla import install_xla

__all__ = ["install_xla"]
