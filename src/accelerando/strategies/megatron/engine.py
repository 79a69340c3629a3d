"""The Megatron-LM engine and the optimizer / scheduler wrappers the Accelerator hands back around it."""

from __future__ import annotations

from typing import Any, NoReturn

import torch

from accelerando.optimizer import AcceleratedOptimizer
from accelerando.scheduler import AcceleratedScheduler
from accelerando.strategies.megatron.requirements import refuse_megatron

__all__ = ["MegatronEngine", "MegatronLMOptimizerWrapper", "MegatronLMSchedulerWrapper"]


class MegatronLMOptimizerWrapper(AcceleratedOptimizer):
    """The optimizer ``prepare`` returns under Megatron-LM: the engine steps and zeroes it itself.

    ``step`` and ``zero_grad`` do nothing (the engine's ``train_step`` does both, once per global
    batch); ``step_was_skipped`` reports Megatron's ``skipped_iter`` (fp16 overflow).

    Args:
        optimizer: Megatron's optimizer.
    """

    def __init__(self, optimizer: Any) -> None:
        super().__init__(optimizer, device_placement=False, scaler=None)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """No-op: the engine zeroes the gradients in its train step."""

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """No-op: the engine steps the optimizer in its train step."""

    @property
    def step_was_skipped(self) -> bool:
        """Whether the engine's last step was skipped (Megatron's ``skipped_iter``)."""
        return bool(getattr(self.optimizer, "skipped_iter", False))


class MegatronLMSchedulerWrapper(AcceleratedScheduler):
    """The scheduler ``prepare`` returns under Megatron-LM: the engine advances it itself.

    Args:
        scheduler: Megatron's learning-rate scheduler.
        optimizers: the wrapped optimizer(s).
    """

    def __init__(self, scheduler: Any, optimizers: Any) -> None:
        super().__init__(scheduler, optimizers, num_processes=1)

    def step(self, *args: Any, **kwargs: Any) -> None:
        """No-op: the engine's train step advances the schedule."""


class MegatronEngine(torch.nn.Module):
    """Megatron-LM's model, optimizer and schedule behind one ``forward`` (train / eval step).

    Args:
        accelerator: the Accelerator.
        model: Megatron's model chunks.
        optimizer: Megatron's optimizer.
        scheduler: Megatron's learning-rate scheduler.

    Raises:
        MegatronLMUnavailableError: at construction; the engine runs megatron-core's
            forward-backward schedules on CUDA, and the message names what is missing and the
            torch-native alternatives (ParallelismConfig(tp_size=...), PipelineParallelPlugin).
    """

    def __init__(self, accelerator: Any, model: Any, optimizer: Any, scheduler: Any) -> None:
        super().__init__()
        refuse_megatron("MegatronEngine")

    def _refuse(self, what: str) -> NoReturn:
        refuse_megatron(f"MegatronEngine.{what}")

    def get_module_config(self) -> Any:
        """megatron-core's model config. Raises MegatronLMUnavailableError (see the class)."""
        self._refuse("get_module_config")

    def train(self, mode: bool = True) -> MegatronEngine:
        """Switch to training mode. Raises MegatronLMUnavailableError (see the class)."""
        self._refuse("train")

    def eval(self) -> MegatronEngine:
        """Switch to evaluation mode. Raises MegatronLMUnavailableError (see the class)."""
        self._refuse("eval")

    def get_batch_data_iterator(self, batch_data: Any) -> Any:
        """Split a batch into micro-batch iterators. Raises MegatronLMUnavailableError (see the class)."""
        self._refuse("get_batch_data_iterator")

    def train_step(self, **batch_data: Any) -> Any:
        """One training step over a global batch. Raises MegatronLMUnavailableError (see the class)."""
        self._refuse("train_step")

    def eval_step(self, **batch_data: Any) -> Any:
        """One evaluation step. Raises MegatronLMUnavailableError (see the class)."""
        self._refuse("eval_step")

    def forward(self, **batch_data: Any) -> Any:
        """Train or eval step by mode. Raises MegatronLMUnavailableError (see the class)."""
        self._refuse("forward")

    def log_eval_results(self) -> None:
        """Log the accumulated evaluation losses. Raises MegatronLMUnavailableError (see the class)."""
        self._refuse("log_eval_results")

    def save_checkpoint(self, output_dir: str) -> None:
        """Save a Megatron checkpoint. Raises MegatronLMUnavailableError (see the class)."""
        self._refuse("save_checkpoint")

    def load_checkpoint(self, input_dir: str) -> None:
        """Load a Megatron checkpoint. Raises MegatronLMUnavailableError (see the class)."""
        self._refuse("load_checkpoint")
