"""Megatron-LM names at the reference's ``accelerate.utils.megatron_lm`` path (re-exports only).

They live in :mod:`accelerando.backends.strategies.megatron`. The plain-torch parts (train-step batch / loss /
forward functions, T5 masks, dummy scheduler and dataloader, loss averaging, the wrappers) work
anywhere; building Megatron's model, optimizer, engine or datasets needs megatron-core on CUDA and
raises :class:`MegatronLMUnavailableError` naming the torch-native alternatives.
"""

from __future__ import annotations

from accelerando.backends.strategies.megatron.engine import (
    MegatronEngine,
    MegatronLMOptimizerWrapper,
    MegatronLMSchedulerWrapper,
)
from accelerando.backends.strategies.megatron.parallel import (
    avg_losses_across_data_parallel_group,
    gather_across_data_parallel_groups,
)
from accelerando.backends.strategies.megatron.requirements import MegatronLMUnavailableError
from accelerando.backends.strategies.megatron.setup import (
    finish_mpu_init,
    initialize,
    model_provider_func,
    prepare_data_loader,
    prepare_model_optimizer_scheduler,
    prepare_optimizer,
    prepare_scheduler,
)
from accelerando.backends.strategies.megatron.train_steps import (
    AbstractTrainStep,
    BertTrainStep,
    GPTTrainStep,
    MegatronLMDummyDataLoader,
    MegatronLMDummyScheduler,
    T5TrainStep,
    get_ltor_masks_and_position_ids,
)

__all__ = [
    "AbstractTrainStep",
    "BertTrainStep",
    "GPTTrainStep",
    "MegatronEngine",
    "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler",
    "MegatronLMOptimizerWrapper",
    "MegatronLMSchedulerWrapper",
    "MegatronLMUnavailableError",
    "T5TrainStep",
    "avg_losses_across_data_parallel_group",
    "finish_mpu_init",
    "gather_across_data_parallel_groups",
    "get_ltor_masks_and_position_ids",
    "initialize",
    "model_provider_func",
    "prepare_data_loader",
    "prepare_model_optimizer_scheduler",
    "prepare_optimizer",
    "prepare_scheduler",
]
