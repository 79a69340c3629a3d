"""Megatron-LM names at the reference's ``accelerate.utils.megatron_lm`` path (re-exports only).

They live in :mod:`accelerando.strategies.megatron`; Megatron-LM training is not supported yet and
creating one of these classes raises ``NotImplementedError`` naming what to use instead.
"""

from __future__ import annotations

from accelerando.strategies.megatron.train_steps import (
    AbstractTrainStep,
    BertTrainStep,
    GPTTrainStep,
    MegatronLMDummyDataLoader,
    MegatronLMDummyScheduler,
    T5TrainStep,
    avg_losses_across_data_parallel_group,
)

__all__ = [
    "AbstractTrainStep",
    "BertTrainStep",
    "GPTTrainStep",
    "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler",
    "T5TrainStep",
    "avg_losses_across_data_parallel_group",
]
