"""The reference's import path ``accelerate.utils.bnb``.

Re-exports from :mod:`accelerando.big_modeling.quantization`.
"""

from __future__ import annotations

from accelerando.big_modeling.quantization import (
    BnbQuantizationConfig,
    get_keys_to_not_convert,
    get_parameter_device,
    get_quantized_model_device_map,
    has_4bit_bnb_layers,
    load_and_quantize_model,
    quantize_and_offload_8bit,
    replace_with_bnb_layers,
)

__all__ = [
    "BnbQuantizationConfig",
    "get_keys_to_not_convert",
    "get_parameter_device",
    "get_quantized_model_device_map",
    "has_4bit_bnb_layers",
    "load_and_quantize_model",
    "quantize_and_offload_8bit",
    "replace_with_bnb_layers",
]
