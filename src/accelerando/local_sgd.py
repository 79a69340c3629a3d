"""LocalSGD: train each replica alone for a few steps, then average the parameters.

It trades some statistical efficiency for much less communication: gradients are never all-reduced
(the model runs under ``no_sync``), and every ``local_sgd_steps`` optimizer steps the parameters are
averaged across processes.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, ClassVar, Protocol

import torch

from accelerando.backends.strategies.base import ReplicatesParameters

if TYPE_CHECKING:
    from accelerando.core.runtime import Runtime

__all__ = ["LocalSGD"]


class _Named(Protocol):
    """What LocalSGD reads of any strategy (``backends.strategies.base.Strategy``): its name, for the refusal."""

    name: ClassVar[str]


class _Averaging(Protocol):
    """What LocalSGD uses of the ``Accelerator`` (a layer above this module)."""

    runtime: Runtime

    @property
    def _strategy(self) -> _Named: ...

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]: ...

    def wait_for_everyone(self) -> None: ...

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> object: ...


class LocalSGD:
    """Context manager running the enclosed loop with local SGD.

    Call ``step()`` after each ``optimizer.step()``. On one process, or with ``enabled=False``, it
    does nothing.

    Args:
        accelerator: the Accelerator that prepared ``model``.
        model: the prepared model.
        local_sgd_steps: optimizer steps between parameter averages.
        enabled: turn local SGD off without changing the loop.

    Raises:
        ValueError: ``local_sgd_steps`` below 1, or a strategy other than single device / DDP.
    """

    def __init__(
        self, accelerator: _Averaging, model: torch.nn.Module, local_sgd_steps: int, enabled: bool = True
    ) -> None:
        if local_sgd_steps < 1:
            raise ValueError(f"local_sgd_steps must be >= 1, got {local_sgd_steps}")
        strategy = accelerator._strategy
        if not isinstance(strategy, ReplicatesParameters):
            raise ValueError(
                f"LocalSGD works with plain data parallelism only, not {strategy.name}; drop LocalSGD or use DDP"
            )
        self._replicas = strategy
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self.enabled = enabled and accelerator.runtime.num_processes > 1
        self.num_steps = 0
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._stack = contextlib.ExitStack()
            self._stack.enter_context(self.accelerator.no_sync(self.model))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._average()
            if self._stack is not None:
                self._stack.close()

    def step(self) -> None:
        """Count an optimizer step; average parameters every ``local_sgd_steps`` steps."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._average()

    def _average(self) -> None:
        self.accelerator.wait_for_everyone()
        with torch.no_grad():
            for param in self._replicas.replica_parameters(self.model):
                mean = self.accelerator.reduce(param.data, reduction="mean")
                assert isinstance(mean, torch.Tensor)  # the reduction of a tensor is a tensor
                param.data.copy_(mean)
