"""The reference's import path ``accelerate.utils.transformer_engine``.

Re-exports from :mod:`accelerando.backends.precision.fp8.transformer_engine`.
"""

from __future__ import annotations

from accelerando.backends.precision.fp8.transformer_engine import (
    apply_fp8_autowrap,
    contextual_fp8_autocast,
    convert_model,
    has_transformer_engine_layers,
    te_recipe,
)

__all__ = [
    "apply_fp8_autowrap",
    "contextual_fp8_autocast",
    "convert_model",
    "has_transformer_engine_layers",
    "te_recipe",
]
