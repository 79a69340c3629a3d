"""Swap a PyTorch optimizer for DeepSpeed's CPU implementation (for ZeRO optimizer offload).

When ZeRO keeps the optimizer state on the CPU, the update runs there; DeepSpeed's vectorised CPU
optimizers (``DeepSpeedCPUAdam``, ``DeepSpeedCPUAdagrad``, ``DeepSpeedCPULion``) do that much faster
than the PyTorch ones. They are compiled by DeepSpeed on first use (a C++ toolchain is needed).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

__all__ = ["map_pytorch_optim_to_deepspeed"]

# Hyper-parameters carried over as the new optimizer's defaults; per-group values (betas, eps, ...)
# travel with the parameter groups themselves.
_CARRIED_DEFAULTS = ("lr", "weight_decay")


def _is_lion(optimizer: torch.optim.Optimizer) -> bool:
    # Lion lives outside torch (bitsandbytes, lion-pytorch); recognise it by class name, importing nothing.
    return any(
        cls.__name__ in ("Lion", "Lion8bit", "Lion32bit", "PagedLion") for cls in type(optimizer).__mro__
    )


def map_pytorch_optim_to_deepspeed(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Build DeepSpeed's CPU optimizer equivalent to ``optimizer``, over the same parameter groups.

    ``Adam`` and ``AdamW`` become ``DeepSpeedCPUAdam`` (``adamw_mode`` true for ``AdamW``, decoupled
    weight decay), ``Adagrad`` becomes ``DeepSpeedCPUAdagrad``, Lion optimizers ``DeepSpeedCPULion``.
    Any other optimizer becomes ``DeepSpeedCPUAdam`` in L2 mode, as in the reference, with a warning
    naming the substitution. ``lr`` and ``weight_decay`` defaults carry over; each parameter group
    keeps its own settings.

    Args:
        optimizer: the PyTorch optimizer (its ``param_groups`` are reused, not copied).

    Returns:
        The DeepSpeed CPU optimizer.

    Raises:
        ImportError: ``deepspeed`` is not installed.
        TypeError: ``optimizer`` is not a ``torch.optim.Optimizer``.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"map_pytorch_optim_to_deepspeed needs a torch.optim.Optimizer, got {type(optimizer).__name__}."
        )
    try:
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        from deepspeed.ops.lion import DeepSpeedCPULion
    except ImportError as error:
        raise ImportError(
            "map_pytorch_optim_to_deepspeed needs DeepSpeed's CPU optimizers: pip install deepspeed."
        ) from error
    defaults: dict[str, Any] = {k: v for k, v in optimizer.defaults.items() if k in _CARRIED_DEFAULTS}
    if isinstance(optimizer, torch.optim.Adagrad):
        return DeepSpeedCPUAdagrad(optimizer.param_groups, **defaults)
    if _is_lion(optimizer):
        return DeepSpeedCPULion(optimizer.param_groups, **defaults)
    if not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        warnings.warn(
            f"DeepSpeed has no CPU version of {type(optimizer).__name__}; using DeepSpeedCPUAdam (L2 weight "
            "decay) instead. Use Adam, AdamW, Adagrad or Lion to keep the same update rule.",
            stacklevel=2,
        )
    # torch's AdamW subclasses Adam in recent versions: test the decoupled variant explicitly.
    defaults["adamw_mode"] = isinstance(optimizer, torch.optim.AdamW)
    return DeepSpeedCPUAdam(optimizer.param_groups, **defaults)
