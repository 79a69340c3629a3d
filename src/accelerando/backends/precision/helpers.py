"""Public helpers over the precision plugins (``accelerando.utils`` re-exports them)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

from accelerando.state import AcceleratorState, PartialState

if TYPE_CHECKING:
    from accelerando.plugins.kwargs import AutocastKwargs

__all__ = ["get_grad_scaler", "get_mixed_precision_context_manager"]


# Any: GradScaler's own keywords, passed on as given.
def get_grad_scaler(distributed_type: object = None, **kwargs: Any) -> torch.amp.GradScaler:
    """Return a ``torch.amp.GradScaler`` for the current device (kwargs as ``GradScalerKwargs``)."""
    return torch.amp.GradScaler(PartialState().device.type, **kwargs)


def get_mixed_precision_context_manager(
    native_amp: bool = False, autocast_kwargs: AutocastKwargs | None = None
) -> contextlib.AbstractContextManager:
    """Return the autocast context for the active Accelerator's mixed precision (a no-op for "no")."""
    state = AcceleratorState()
    precision = state.mixed_precision if native_amp else "no"
    if precision not in ("fp16", "bf16"):
        return contextlib.nullcontext()
    kwargs = autocast_kwargs.to_kwargs() if autocast_kwargs is not None else {}
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return torch.autocast(device_type=PartialState().device.type, dtype=dtype, **kwargs)
