"""Megatron-LM initialisation and the ``prepare_*`` steps that build Megatron's model, optimizer, schedule
and data loaders. All of them run megatron-core on CUDA and refuse without it."""

from __future__ import annotations

from typing import Any

from accelerando.strategies.megatron.requirements import refuse_megatron

__all__ = [
    "finish_mpu_init",
    "initialize",
    "model_provider_func",
    "prepare_data_loader",
    "prepare_model_optimizer_scheduler",
    "prepare_optimizer",
    "prepare_scheduler",
]


def initialize(accelerator: Any, extra_args_provider: Any = None, args_defaults: Any = None) -> None:
    """Initialise Megatron-LM (arguments, model-parallel groups, seeds) from the plugin's arguments.

    Raises:
        MegatronLMUnavailableError: megatron-core / CUDA missing (the message names the alternatives).
    """
    refuse_megatron("megatron_lm.initialize")


def finish_mpu_init() -> None:
    """Finish megatron-core's model-parallel initialisation (groups, seeds).

    Raises:
        MegatronLMUnavailableError: megatron-core / CUDA missing.
    """
    refuse_megatron("megatron_lm.finish_mpu_init")


def model_provider_func(
    pre_process: bool = True, post_process: bool = True, add_encoder: bool = True, add_decoder: bool = True
) -> Any:
    """Build Megatron's GPT / BERT / T5 model for this pipeline stage.

    Raises:
        MegatronLMUnavailableError: megatron-core / CUDA missing.
    """
    refuse_megatron("megatron_lm.model_provider_func")


def prepare_data_loader(accelerator: Any, dataloader: Any) -> Any:
    """Rebuild ``dataloader`` for Megatron's data-parallel ranks and micro-batches.

    Raises:
        MegatronLMUnavailableError: megatron-core / CUDA missing.
    """
    refuse_megatron("megatron_lm.prepare_data_loader")


def prepare_model_optimizer_scheduler(accelerator: Any) -> tuple[Any, Any, Any]:
    """Build Megatron's model, optimizer and schedule from the plugin's arguments.

    Raises:
        MegatronLMUnavailableError: megatron-core / CUDA missing.
    """
    refuse_megatron("megatron_lm.prepare_model_optimizer_scheduler")


def prepare_optimizer(accelerator: Any, model: Any) -> Any:
    """Build Megatron's optimizer for ``model``.

    Raises:
        MegatronLMUnavailableError: megatron-core / CUDA missing.
    """
    refuse_megatron("megatron_lm.prepare_optimizer")


def prepare_scheduler(accelerator: Any, optimizer: Any, scheduler: Any) -> Any:
    """Build Megatron's learning-rate schedule.

    Raises:
        MegatronLMUnavailableError: megatron-core / CUDA missing.
    """
    refuse_megatron("megatron_lm.prepare_scheduler")
