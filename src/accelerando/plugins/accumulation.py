"""GradientAccumulationPlugin: how micro-batches add up to one optimizer step."""

from __future__ import annotations

from dataclasses import dataclass

from accelerando.plugins.kwargs_handler import KwargsHandler

__all__ = ["GradientAccumulationPlugin"]


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """Gradient accumulation settings.

    Args:
        num_steps: micro-batches per optimizer step (>= 1). None = from the launcher / default 1.
        adjust_scheduler: step the scheduler as if each optimizer step were ``num_steps`` steps.
        sync_with_dataloader: force a sync (and optimizer step) on the last batch of a dataloader.
        sync_each_batch: all-reduce gradients on every micro-batch (less memory, more communication).

    Raises:
        ValueError: ``num_steps`` below 1.
    """

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        if self.num_steps is not None and (not isinstance(self.num_steps, int) or self.num_steps < 1):
            raise ValueError(
                f"GradientAccumulationPlugin.num_steps must be an integer >= 1, got {self.num_steps!r}"
            )
