"""The optimizer of a fault-tolerant run: each step joins a quorum and is committed only if every group agrees."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torchft.optim import OptimizerWrapper

if TYPE_CHECKING:
    from torchft import Manager

__all__ = ["FaultTolerantOptimizer"]


class FaultTolerantOptimizer(OptimizerWrapper):
    """torchft's ``OptimizerWrapper`` with the attributes a torch optimizer has and accelerando reads.

    ``zero_grad()`` starts the step's quorum (a recovering group copies a live group's state there);
    ``step()`` steps the wrapped optimizer only when the replica groups agree to commit the step (an
    all-reduce that failed because a group died makes every group drop the step and retry it).

    Args:
        manager: the replica group's torchft ``Manager``.
        optimizer: the user's optimizer.
    """

    def __init__(self, manager: Manager, optimizer: torch.optim.Optimizer) -> None:
        super().__init__(manager, optimizer)

    @property
    def defaults(self) -> dict[str, object]:  # type: ignore[override]
        """The wrapped optimizer's defaults."""
        return self.optim.defaults

    def __repr__(self) -> str:
        return f"FaultTolerantOptimizer({self.optim!r})"
