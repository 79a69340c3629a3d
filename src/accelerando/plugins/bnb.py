"""BnbQuantizationConfig: the options of 8-bit / 4-bit loading through bitsandbytes.

Defined in :mod:`accelerando.utils.bnb` (the loader below the plugins layer needs it); this is the
import path the other plugin configs share.
"""

from __future__ import annotations

from accelerando.utils.bnb import BnbQuantizationConfig

__all__ = ["BnbQuantizationConfig"]
