"""Precision plugins: how forward, backward and optimizer steps treat numbers.

``build_precision`` is the one place a precision name becomes an object; FP8 lives in its own
module and is imported only when requested. A precision this hardware only emulates (slower than
float32) is reported once per process by :func:`accelerando.backends.precision.advice.warn_if_emulated`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from accelerando.backends.precision.base import Precision

if TYPE_CHECKING:
    from accelerando.core.settings import Settings

__all__ = ["Precision", "build_precision"]


def build_precision(
    mixed_precision: str,
    device_type: str,
    # Any: GradScaler's and torch.autocast's own keywords, passed on as given.
    scaler_kwargs: dict[str, Any] | None = None,
    static_scale: bool = False,
    autocast_kwargs: dict[str, Any] | None = None,
    loss_scaling: bool = True,
    *,
    handlers: Mapping[type, object] | None = None,
    settings: Settings | None = None,
) -> Precision:
    """Return the precision object for ``mixed_precision`` ("no", "fp16", "bf16", "fp8").

    ``loss_scaling=False`` keeps autocast but no GradScaler (for engines that scale the loss
    themselves, e.g. DeepSpeed). For fp8, ``handlers`` (kwargs-handler class -> instance) and
    ``settings`` choose the backend (see :func:`accelerando.backends.precision.fp8.choose_fp8_backend`). A
    precision emulated on this hardware logs one warning per process naming the faster choice.

    Raises:
        ValueError: an unknown name, or a mode the device cannot run (with the fix).
        RuntimeError: fp8 with a backend that cannot run here (the message names "ao", which runs).
    """
    import torch

    if mixed_precision == "no":
        return Precision()
    # Deferred: full precision (the default) needs no advice about emulated low-precision maths.
    from accelerando.backends.precision.advice import warn_if_emulated

    if mixed_precision in ("fp16", "bf16"):
        from accelerando.backends.precision.amp import AMPPrecision

        dtype = torch.float16 if mixed_precision == "fp16" else torch.bfloat16
        amp = AMPPrecision(dtype, device_type, scaler_kwargs, static_scale, autocast_kwargs, loss_scaling)
        warn_if_emulated(mixed_precision, device_type)
        return amp
    if mixed_precision == "fp8":
        from accelerando.backends.precision.fp8 import build_fp8_precision

        fp8 = build_fp8_precision(device_type, handlers, settings)
        warn_if_emulated(mixed_precision, device_type, getattr(fp8, "backend_name", None))
        return fp8
    raise ValueError(
        f"unknown mixed_precision {mixed_precision!r}; choose one of 'no', 'fp16', 'bf16', 'fp8'"
    )
