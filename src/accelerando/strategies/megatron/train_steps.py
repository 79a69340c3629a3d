"""Megatron-LM train steps, dummy scheduler and dataloader: placeholders until Megatron-LM is supported.

Megatron-LM training needs megatron-core on CUDA GPUs, which accelerando does not support yet. The
classes exist so scripts importing them load; creating one fails with what is missing.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "AbstractTrainStep",
    "BertTrainStep",
    "GPTTrainStep",
    "MEGATRON_UNSUPPORTED",
    "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler",
    "T5TrainStep",
    "avg_losses_across_data_parallel_group",
]

MEGATRON_UNSUPPORTED = (
    "Megatron-LM training needs megatron-core and CUDA GPUs, which accelerando does not support yet; "
    "use FSDP (fsdp_plugin) or DeepSpeed (deepspeed_plugin) for large models"
)


class _Unsupported:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(MEGATRON_UNSUPPORTED)


class MegatronLMDummyScheduler(_Unsupported):
    """Placeholder scheduler for Megatron-LM. Raises NotImplementedError when created."""


class MegatronLMDummyDataLoader(_Unsupported):
    """Placeholder dataloader for Megatron-LM datasets. Raises NotImplementedError when created."""


class AbstractTrainStep(_Unsupported):
    """Base of Megatron-LM train steps. Raises NotImplementedError when created."""


class GPTTrainStep(AbstractTrainStep):
    """GPT train step. Raises NotImplementedError when created."""


class BertTrainStep(AbstractTrainStep):
    """BERT train step. Raises NotImplementedError when created."""


class T5TrainStep(AbstractTrainStep):
    """T5 train step. Raises NotImplementedError when created."""


def avg_losses_across_data_parallel_group(losses: list[torch.Tensor]) -> torch.Tensor:
    """Average ``losses`` over the data-parallel processes (all processes without Megatron)."""
    from accelerando.utils.operations import reduce

    stacked = torch.stack([loss.detach().float().reshape(()) for loss in losses])
    return reduce(stacked, reduction="mean")
