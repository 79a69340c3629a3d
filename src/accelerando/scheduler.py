"""AcceleratedScheduler: a learning-rate scheduler that follows real optimizer steps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from accelerando.core.gradient_state import GradientState
from accelerando.state import PartialState

if TYPE_CHECKING:
    import torch

__all__ = ["AcceleratedScheduler"]


class AcceleratedScheduler:
    """Wraps a torch LR scheduler so that it steps once per real optimizer step.

    - While accumulating (a non-sync micro-batch) ``step()`` does not move the schedule (with
      ``adjust_scheduler`` it only advances PyTorch's step counter so its order check stays quiet).
    - When any wrapped optimizer skipped its step (fp16 overflow) the schedule does not move.
    - Without ``split_batches``, each process sees 1/N of the data per step, so one real step covers
      N "single-process" steps: the schedule advances N times (never past a ``total_steps`` bound),
      which keeps a schedule written for one process correct on N.

    Args:
        scheduler: the user's scheduler.
        optimizers: the AcceleratedOptimizer(s) it follows.
        step_with_optimizer: False = step exactly when the user calls ``step()``.
        split_batches: whether batches are split (then one step per optimizer step).
        num_processes: number of processes (read from the state when None).
    """

    def __init__(
        self,
        # Any scheduler-like object (torch's LRScheduler, DeepSpeed's schedules, a user's own): its own
        # methods are called, and unknown attributes are forwarded to it.
        scheduler: Any,
        optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        step_with_optimizer: bool = True,
        split_batches: bool = False,
        num_processes: int | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches
        self.gradient_state = GradientState()
        if num_processes is None:
            num_processes = PartialState().num_processes
        self.num_processes = num_processes
        # Set by load_state with elastic_batch="keep_global": the saved run's pace, kept on another size.
        self._repeats_override: int | None = None

    @property
    def steps_per_optimizer_step(self) -> int:
        """How many times the schedule advances per optimizer step (see the class docstring)."""
        return self._repeats_override or (1 if self.split_batches else self.num_processes)

    @steps_per_optimizer_step.setter
    def steps_per_optimizer_step(self, value: int) -> None:
        if int(value) < 1:
            raise ValueError(f"steps_per_optimizer_step must be at least 1, got {value}")
        self._repeats_override = int(value)

    def step(self, *args: object, **kwargs: object) -> None:
        """Advance the schedule as described in the class docstring."""
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            if self.gradient_state.adjust_scheduler:
                # torch 2.13: torch/optim/lr_scheduler.py:178 (private; counts the skipped step as torch's step() would)
                self.scheduler._step_count += 1
            return
        for opt in self.optimizers:
            if getattr(opt, "step_was_skipped", False):
                return
        repeats = self._repeats_override or (1 if self.split_batches else self.num_processes)
        total = getattr(self.scheduler, "total_steps", None)
        for _ in range(repeats):
            # OneCycleLR raises past its last step; stop there instead.
            # torch 2.13: torch/optim/lr_scheduler.py:178 (private; steps taken so far)
            if total is not None and self.scheduler._step_count > total:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        """The learning rates of the last step."""
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, object]:
        """The wrapped scheduler's state dict."""
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, object]) -> None:
        """Restore the wrapped scheduler's state."""
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self) -> list[float | torch.Tensor]:
        """The wrapped scheduler's ``get_lr()``."""
        return self.scheduler.get_lr()

    def print_lr(self, *args: object, **kwargs: object) -> None:
        """The wrapped scheduler's ``print_lr``."""
        return self.scheduler.print_lr(*args, **kwargs)

    def __getattr__(self, name: str) -> object:
        if name in ("scheduler", "__setstate__", "__getstate__"):
            raise AttributeError(name)
        return getattr(self.scheduler, name)
