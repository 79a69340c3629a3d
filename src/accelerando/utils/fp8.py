"""FP8 helpers under one import path: Transformer Engine (``utils.transformer_engine``) and torchao
(``utils.ao``). Each function checks for its backend when called and names the fix when it is missing.
"""

from __future__ import annotations

from accelerando.utils.ao import (
    convert_model_to_fp8_ao,
    filter_first_and_last_linear_layers,
    filter_linear_layers,
    find_first_last_linear_layers,
    has_ao_layers,
)
from accelerando.utils.transformer_engine import (
    apply_fp8_autowrap,
    contextual_fp8_autocast,
    convert_model,
    has_transformer_engine_layers,
)

__all__ = [
    "apply_fp8_autowrap",
    "contextual_fp8_autocast",
    "convert_model",
    "convert_model_to_fp8_ao",
    "filter_first_and_last_linear_layers",
    "filter_linear_layers",
    "find_first_last_linear_layers",
    "has_ao_layers",
    "has_transformer_engine_layers",
]
