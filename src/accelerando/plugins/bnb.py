"""The options of quantised loading: :class:`BnbQuantizationConfig`.

The loader that reads them is :mod:`accelerando.big_modeling.quantization`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from accelerando.core.enums_on_demand import CustomDtype

__all__ = ["BnbQuantizationConfig"]

# Names accepted for the compute dtype of 4-bit layers (the reference's three spellings first).
_COMPUTE_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
_QUANT_TYPES = ("fp4", "nf4")


def _as_dtype(value: object, field_name: str) -> torch.dtype:
    """Turn a dtype name or ``torch.dtype`` into a floating ``torch.dtype``; raise ValueError otherwise."""
    if isinstance(value, str):
        key = value.strip().lower().removeprefix("torch.")
        if key not in _COMPUTE_DTYPES:
            raise ValueError(
                f"{field_name}={value!r} is not a dtype name this config knows; use one of "
                f"{sorted(_COMPUTE_DTYPES)} or a torch.dtype such as torch.float16"
            )
        return _COMPUTE_DTYPES[key]
    if isinstance(value, torch.dtype):
        if not value.is_floating_point:
            raise ValueError(f"{field_name} must be a floating-point dtype, got {value}")
        return value
    raise ValueError(
        f"{field_name} must be a string such as 'fp16' or a torch.dtype, got {type(value).__name__} ({value!r})"
    )


def _check_names(value: object, field_name: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise ValueError(f"{field_name} must be a list of module names (strings), got {value!r}")
    return value


@dataclass
class BnbQuantizationConfig:
    """Options for loading a model with its Linear layers quantised by bitsandbytes.

    Exactly one of ``load_in_8bit`` / ``load_in_4bit`` must be True.

    Args:
        load_in_8bit: replace Linear layers by ``bnb.nn.Linear8bitLt`` (LLM.int8()).
        llm_int8_threshold: outlier threshold of LLM.int8(): activation columns with a value above it
            are computed in 16-bit (0 disables the decomposition).
        load_in_4bit: replace Linear layers by ``bnb.nn.Linear4bit``.
        bnb_4bit_quant_type: 4-bit data type, ``"fp4"`` or ``"nf4"``.
        bnb_4bit_use_double_quant: also quantise the 4-bit scaling constants (saves ~0.4 bit/param).
        bnb_4bit_compute_dtype: dtype 4-bit layers compute in: ``"fp32"``, ``"fp16"``, ``"bf16"`` or a
            ``torch.dtype``; becomes a ``torch.dtype``.
        torch_dtype: dtype of the weights left unquantised (a ``torch.dtype`` or a name); None keeps the
            checkpoint's dtype.
        skip_modules: module names never quantised (default: the output head and tied weights, found
            by :func:`~accelerando.big_modeling.quantization.get_keys_to_not_convert`).
        keep_in_fp32_modules: module names kept unquantised and in float32.

    Attributes:
        target_dtype: ``torch.int8`` for 8-bit, ``CustomDtype.INT4`` for 4-bit (sizes for device maps).

    Raises:
        ValueError: for a field of the wrong type, both or neither of ``load_in_8bit`` /
            ``load_in_4bit``, an unknown 4-bit quantisation type, or an unknown dtype name.
    """

    load_in_8bit: bool = False
    llm_int8_threshold: float = 6.0
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_use_double_quant: bool = False
    bnb_4bit_compute_dtype: Any = "fp16"
    torch_dtype: Any = None
    skip_modules: list[str] | None = None
    keep_in_fp32_modules: list[str] | None = field(default=None)

    def __post_init__(self) -> None:
        for name in ("load_in_8bit", "load_in_4bit", "bnb_4bit_use_double_quant"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        threshold = self.llm_int8_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise ValueError(f"llm_int8_threshold must be a number, got {threshold!r}")
        self.llm_int8_threshold = float(threshold)
        if self.bnb_4bit_quant_type not in _QUANT_TYPES:
            raise ValueError(f"bnb_4bit_quant_type must be 'fp4' or 'nf4', got {self.bnb_4bit_quant_type!r}")
        self.bnb_4bit_compute_dtype = _as_dtype(self.bnb_4bit_compute_dtype, "bnb_4bit_compute_dtype")
        if self.torch_dtype is not None:
            self.torch_dtype = _as_dtype(self.torch_dtype, "torch_dtype")
        self.skip_modules = _check_names(self.skip_modules, "skip_modules")
        self.keep_in_fp32_modules = _check_names(self.keep_in_fp32_modules, "keep_in_fp32_modules")
        if self.load_in_8bit and self.load_in_4bit:
            raise ValueError("load_in_8bit and load_in_4bit are both True: choose one of them")
        if not (self.load_in_8bit or self.load_in_4bit):
            raise ValueError(
                "set load_in_8bit=True or load_in_4bit=True: a quantization config needs one of them"
            )
        self.target_dtype: torch.dtype | CustomDtype = torch.int8 if self.load_in_8bit else CustomDtype.INT4
