"""The precision contract: how numbers are represented in forward, backward and optimizer steps."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["Precision"]


class Precision:
    """Full precision (fp32): every hook is the plain PyTorch operation, so it costs nothing.

    Contract, in the order the Accelerator calls it:
    ``convert_module(model)`` once in ``prepare``; ``autocast()`` around user code on request;
    ``backward(loss)`` per micro-batch; ``unscale_(optimizer)`` before clipping;
    ``optimizer_step(optimizer) -> bool`` on sync steps (False = skipped by the loss scaler);
    ``state_dict()`` / ``load_state_dict()`` for checkpoints.
    """

    name: str = "no"
    # A ``torch.amp.GradScaler`` under fp16 (its class depends on the device family), else None.
    scaler: torch.amp.GradScaler | None = None

    def prepare_objects(
        self,
        objects: Sequence[object],
        placement: Sequence[bool],
        device: torch.device | None,
        is_prepared: Callable[[object], bool],
    ) -> list[object]:
        """Convert the objects of one ``prepare`` call that must change together, before any wrapping.

        MS-AMP converts a model together with its optimizer; every other precision returns the
        objects unchanged, in the same order.
        """
        return list(objects)

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """Prepare ``model`` for this precision (no change in fp32)."""
        return model

    def autocast(
        self, enabled: bool = True, cache_enabled: bool | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """Context manager running its block in this precision (a no-op in fp32)."""
        return contextlib.nullcontext()

    # Any: Tensor.backward's own keywords (retain_graph, create_graph...), passed on as given.
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Back-propagate ``loss``."""
        # torch's stub leaves Tensor.backward's parameters untyped.
        loss.backward(**kwargs)  # pyright: ignore[reportUnknownMemberType]

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide gradients by the loss scale (no-op without a scaler)."""

    # Any: Optimizer.step's own keywords (a closure), passed on as given.
    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        """Run ``optimizer.step``; return False when the step was skipped."""
        optimizer.step(**kwargs)
        return True

    def state_dict(self) -> dict[str, object]:
        """Scaler state for checkpoints ({} without a scaler)."""
        return {}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore ``state_dict()``'s result."""
