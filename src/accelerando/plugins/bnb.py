"""BnbQuantizationConfig: bitsandbytes 8-bit / 4-bit loading options (configuration only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from accelerando.plugins.kwargs import KwargsHandler

__all__ = ["BnbQuantizationConfig"]


@dataclass
class BnbQuantizationConfig(KwargsHandler):
    """Options for quantised loading with bitsandbytes.

    Raises:
        ValueError: both 8-bit and 4-bit requested, or an unknown 4-bit quantisation type.
    """

    load_in_8bit: bool = False
    llm_int8_threshold: float = 6.0
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_use_double_quant: bool = False
    bnb_4bit_compute_dtype: Any = "fp32"
    torch_dtype: Any = None
    skip_modules: list[str] | None = None
    keep_in_fp32_modules: list[str] | None = field(default=None)

    def __post_init__(self) -> None:
        if self.load_in_8bit and self.load_in_4bit:
            raise ValueError("choose load_in_8bit or load_in_4bit, not both")
        if self.bnb_4bit_quant_type not in ("fp4", "nf4"):
            raise ValueError(f"bnb_4bit_quant_type must be 'fp4' or 'nf4', got {self.bnb_4bit_quant_type!r}")
