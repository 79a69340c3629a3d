"""Megatron-LM's TensorBoard scalars for the engine's steps (``MegatronLMPlugin(tensorboard_dir=...)``).

Written by the last process (which holds the last pipeline stage's losses), as Megatron-LM does.
The switches are Megatron-LM's ``log_*_to_tensorboard`` arguments (``set_all_logging_options``
turns them all on); learning rate and loss scale are logged unless switched off.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

__all__ = ["TrainingBoard"]

# Megatron-LM's defaults for its logging switches.
_DEFAULT_ON = ("log_learning_rate_to_tensorboard", "log_loss_scale_to_tensorboard")
# Switches megatron-core has no helper for (Megatron-LM's timers and parameter-norm code live in its
# training package); asking for them warns once.
_NOT_WRITTEN = ("log_params_norm", "log_timers_to_tensorboard")


def _process() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class TrainingBoard:
    """Writes the engine's losses, learning rate, loss scale, gradient norm ... to TensorBoard.

    Args:
        args: the Megatron-LM arguments (``tensorboard_dir`` and the ``log_*`` switches).

    Raises:
        ImportError: ``tensorboard_dir`` is set but the tensorboard package is missing.
    """

    def __init__(self, args: SimpleNamespace) -> None:
        self.args = args
        self.writer: SummaryWriter | None = None
        rank, world = _process()
        if not getattr(args, "tensorboard_dir", None) or rank != world - 1:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise ImportError(
                "MegatronLMPlugin(tensorboard_dir=...) writes TensorBoard logs and needs the tensorboard package: "
                "pip install tensorboard"
            ) from error
        self.writer = SummaryWriter(log_dir=args.tensorboard_dir)
        asked = [name for name in _NOT_WRITTEN if getattr(args, name, False)]
        if asked:
            warnings.warn(
                f"{asked} are not written: megatron-core has no training timers or parameter-norm helper "
                "(they live in Megatron-LM's training package)",
                stacklevel=3,
            )

    def _on(self, name: str) -> bool:
        return bool(getattr(self.args, name, name in _DEFAULT_ON))

    def train_step(
        self,
        iteration: int,
        loss_dict: Mapping[str, torch.Tensor | float],
        learning_rate: float | None,
        loss_scale: float | None,
        grad_norm: float | None,
        num_zeros_in_grad: int | None,
    ) -> None:
        """Write one training step's scalars (losses always; the rest by their switches)."""
        if self.writer is None:
            return
        add = self.writer.add_scalar
        for key, value in loss_dict.items():
            if torch.as_tensor(value).dim() == 0:
                add(key, float(value), iteration)
        if learning_rate is not None and self._on("log_learning_rate_to_tensorboard"):
            add("learning-rate", learning_rate, iteration)
        if loss_scale is not None and self._on("log_loss_scale_to_tensorboard"):
            add("loss-scale", loss_scale, iteration)
        if self._on("log_batch_size_to_tensorboard"):
            add("batch-size", int(self.args.global_batch_size), iteration)
        if self._on("log_world_size_to_tensorboard"):
            add("world-size", _process()[1], iteration)
        if grad_norm is not None:
            add("grad-norm", float(grad_norm), iteration)
        if num_zeros_in_grad is not None and self._on("log_num_zeros_in_grad"):
            add("num-zeros", float(num_zeros_in_grad), iteration)
        if self._on("log_memory_to_tensorboard") and torch.cuda.is_available():
            add("mem-allocated-bytes", torch.cuda.memory_allocated(), iteration)
        self.writer.flush()

    def validation(self, iteration: int, values: Mapping[str, float]) -> None:
        """Write the averaged validation losses (and perplexities with ``log_validation_ppl_to_tensorboard``)."""
        if self.writer is None:
            return
        for key, value in values.items():
            self.writer.add_scalar(f"{key} validation", value, iteration)
            if self._on("log_validation_ppl_to_tensorboard"):
                self.writer.add_scalar(f"{key} validation ppl", math.exp(min(20.0, value)), iteration)
        self.writer.flush()
