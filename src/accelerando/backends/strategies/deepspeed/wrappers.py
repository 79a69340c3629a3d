"""Objects a DeepSpeed training script sees: placeholders and engine/optimizer/scheduler wrappers."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, cast

import torch

from accelerando.core.gradient_state import GradientState
from accelerando.optimizer import AcceleratedOptimizer
from accelerando.scheduler import AcceleratedScheduler

if TYPE_CHECKING:
    from deepspeed.runtime.engine import DeepSpeedEngine

__all__ = [
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
]

# What DeepSpeedOptimizerWrapper.state_dict returns: the real state lives in the engine checkpoint.
ENGINE_CHECKPOINT_MARKER = "accelerando_deepspeed_engine_checkpoint"


class DummyOptim:
    """Placeholder for the optimizer built by DeepSpeed from the config's ``"optimizer"`` section.

    Pass it to ``prepare`` with the model; its ``lr`` / ``weight_decay`` / extra keyword arguments fill
    the section's ``"auto"`` values.

    Args:
        params: the model parameters (or parameter groups).
        lr: learning rate for ``"lr": "auto"``.
        weight_decay: weight decay for ``"weight_decay": "auto"``.
        **kwargs: other hyper-parameters (``betas``, ``eps``) for their ``"auto"`` values.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter] | Iterable[dict[str, object]],
        lr: float = 0.001,
        weight_decay: float = 0.0,
        **kwargs: object,
    ) -> None:
        self.params = list(params)
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """Placeholder for the scheduler built by DeepSpeed from the config's ``"scheduler"`` section.

    Args:
        optimizer: the ``DummyOptim`` (or optimizer) it schedules.
        total_num_steps: fills ``"total_num_steps": "auto"``.
        warmup_num_steps: fills ``"warmup_num_steps": "auto"``.
        lr_scheduler_callable: ``callable(optimizer) -> scheduler`` used instead of the config section.
        **kwargs: other values for ``"auto"`` scheduler parameters.
    """

    def __init__(
        self,
        optimizer: object,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        lr_scheduler_callable: Callable[[torch.optim.Optimizer], object] | None = None,
        **kwargs: object,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs


class DeepSpeedEngineWrapper:
    """Runs backward and the optimizer step through a DeepSpeed engine.

    The engine divides the loss by its own accumulation steps, so the Accelerator must not divide it
    again (the strategy is a ``ScalesLossForAccumulation``).

    Args:
        engine: the ``deepspeed.DeepSpeedEngine``.
    """

    def __init__(self, engine: DeepSpeedEngine) -> None:
        self.engine = engine

    def backward(self, loss: torch.Tensor, sync_gradients: bool = True, **kwargs: object) -> None:
        """Back-propagate ``loss``; on a sync micro-batch also reduce gradients and step.

        The engine's own micro-step counter is overridden by ``sync_gradients`` so that its
        accumulation boundary always equals the Accelerator's (including the forced sync on the
        last batch of a dataloader).

        Args:
            loss: the unscaled loss of this micro-batch.
            sync_gradients: whether this micro-batch ends an accumulation cycle.
            **kwargs: forwarded to ``engine.backward``.
        """
        self.engine.set_gradient_accumulation_boundary(bool(sync_gradients))
        # The caller's options go to DeepSpeed's backward as they are (its own keywords).
        backward: Callable[..., object] = self.engine.backward
        backward(loss, **kwargs)
        # step() on a non-boundary micro-batch only advances the engine's counters; on the boundary
        # it runs clipping (from the config), the optimizer, the scheduler and zeroes gradients.
        self.engine.step()

    def get_global_grad_norm(self) -> float | None:
        """The gradient norm the engine computed at its last optimizer step (None if not computed)."""
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else None


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """The optimizer a DeepSpeed script sees; the engine already steps and zeroes it.

    ``step()`` and ``zero_grad()`` are no-ops (``DeepSpeedEngineWrapper.backward`` did them);
    ``step_was_skipped`` reports the engine's fp16 overflow. ``state_dict()`` returns a marker: the
    (per-process, sharded) optimizer state is saved by the engine checkpoint.

    Args:
        optimizer: ``engine.optimizer`` (a ZeRO optimizer or the user's).
    """

    def __init__(self, optimizer: object) -> None:
        # AcceleratedOptimizer forwards attribute access to what it wraps; ZeRO's optimizers have
        # torch's optimizer interface without being torch.optim.Optimizer subclasses.
        super().__init__(cast(torch.optim.Optimizer, optimizer), device_placement=False, scaler=None)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """No-op: the engine zeroes gradients after its step."""

    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        """No-op: the engine stepped in ``backward``; records whether it skipped on overflow."""
        if GradientState().sync_gradients:
            self._accelerate_step_called = True
        self._is_overflow = bool(getattr(self.optimizer, "overflow", False))

    def state_dict(self) -> dict[str, object]:  # type: ignore[override]
        """A marker; the real state is in the engine checkpoint written by ``save_state``."""
        return {ENGINE_CHECKPOINT_MARKER: True}

    def load_state_dict(self, state_dict: dict[str, object]) -> None:  # type: ignore[override]
        """Accept the marker (the engine checkpoint restored the state) or a full optimizer state.

        Raises:
            ValueError: a plain state dict under ZeRO (it would hold only one process's shard).
        """
        if state_dict.get(ENGINE_CHECKPOINT_MARKER):
            return
        try:
            self.optimizer.load_state_dict(state_dict)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                "a DeepSpeed optimizer's state is restored from the engine checkpoint written by "
                "Accelerator.save_state; load that checkpoint with Accelerator.load_state"
            ) from exc


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """The scheduler a DeepSpeed script sees; the engine steps it at each optimizer step.

    Args:
        scheduler: ``engine.lr_scheduler``.
        optimizers: the ``DeepSpeedOptimizerWrapper``(s).
    """

    def __init__(self, scheduler: object, optimizers: Sequence[AcceleratedOptimizer]) -> None:
        super().__init__(scheduler, optimizers, step_with_optimizer=True, split_batches=True, num_processes=1)

    def step(self, *args: object, **kwargs: object) -> None:
        """No-op: the engine stepped the schedule after its optimizer step."""
