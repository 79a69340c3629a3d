"""Megatron-LM initialisation and the ``prepare_*`` steps that build Megatron's model, optimizer, schedule
and data loaders over megatron-core.

Order (``MegatronStrategy.prepare_all`` follows it): :func:`initialize` (arguments, model-parallel
groups, seeds) -> :func:`prepare_model_optimizer_scheduler` (model chunks -> CUDA -> fp16/bf16
wrapper -> megatron-core DDP -> optimizer -> schedule) -> :func:`prepare_data_loader` per loader.
The model-parallel groups (:func:`init_model_parallel`) and model construction also run on the
CPU over gloo; seeding, DDP, the optimizer and training need CUDA and say so.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast, overload

import torch

from accelerando.backends.strategies.megatron.args import build_args, get_args, set_args
from accelerando.backends.strategies.megatron.config import (
    check_supported,
    ddp_config,
    optimizer_config,
    scheduler_steps,
    transformer_config,
)
from accelerando.backends.strategies.megatron.models import build_model, build_model_chunks
from accelerando.backends.strategies.megatron.requirements import require_cuda, require_megatron_core
from accelerando.backends.strategies.megatron.train_steps import MegatronLMDummyDataLoader
from accelerando.core.process_group import start
from accelerando.data_loader.prepare import prepare_data_loader as shard_loader

if TYPE_CHECKING:
    from megatron.core.optimizer import MegatronOptimizer
    from megatron.core.optimizer.optimizer_config import OptimizerConfig, ParamKey
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler, ParamGroupOverride
    from megatron.core.transformer.module import MegatronModule

    from accelerando.backends.strategies.megatron.holder import MegatronAccelerator, MegatronState
    from accelerando.plugins.megatron import MegatronLMPlugin

#: The reference's hook adding options to Megatron-LM's parser (returns the parser, or None: changed in place).
ExtraArgsProvider = Callable[[argparse.ArgumentParser], argparse.ArgumentParser | None]

__all__ = [
    "finish_mpu_init",
    "init_model_parallel",
    "initialize",
    "model_provider_func",
    "prepare_data_loader",
    "prepare_model_optimizer_scheduler",
    "prepare_optimizer",
    "prepare_scheduler",
]


def _plugin(accelerator: MegatronAccelerator) -> MegatronLMPlugin:
    plugin: MegatronLMPlugin | None = getattr(accelerator.state, "megatron_lm_plugin", None)
    if plugin is None:
        raise RuntimeError(
            "No Megatron-LM plugin is set: create the Accelerator with megatron_lm_plugin=MegatronLMPlugin(...) "
            "or launch with --use_megatron_lm"
        )
    return plugin


def init_model_parallel(args: SimpleNamespace) -> None:
    """Create megatron-core's tensor / pipeline / context / expert / data-parallel groups from ``args``.

    Needs an initialised default process group (NCCL on GPUs, gloo works on the CPU); replaces
    groups made by an earlier call. Afterwards ``args.data_parallel_size`` and
    ``args.global_batch_size`` hold megatron-core's data-parallel size.

    Raises:
        MegatronLMUnavailableError: megatron-core is not installed.
        RuntimeError: torch.distributed is not initialised.
        ValueError: the world size is not a multiple of tp * pp * cp.
    """
    require_megatron_core("Megatron-LM's model-parallel groups")
    import torch.distributed as dist
    from megatron.core import parallel_state as ps  # type: ignore[import-not-found]

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "Megatron-LM needs torch.distributed: create the Accelerator first (it starts the process group), "
            "and launch with `accelerando launch` or torchrun"
        )
    tp, pp = int(args.tensor_model_parallel_size), int(args.pipeline_model_parallel_size)
    cp = int(args.context_parallel_size)
    world = dist.get_world_size()
    if world % (tp * pp * cp):
        raise ValueError(
            f"{world} processes do not split into tp_degree={tp} x pp_degree={pp} x context_parallel_size={cp}; "
            "use a process count that is a multiple of their product"
        )
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
        context_parallel_size=cp,
        expert_model_parallel_size=int(args.expert_model_parallel_size),
        expert_tensor_parallel_size=args.expert_tensor_parallel_size,
    )
    args.data_parallel_size = ps.get_data_parallel_world_size()
    args.global_batch_size = (
        int(args.micro_batch_size) * args.data_parallel_size * int(args.num_micro_batches)
    )


def _ensure_process_group(state: MegatronState) -> None:
    """Start a one-process NCCL group for a single-GPU run (megatron-core's groups need a default group).

    Raises:
        RuntimeError: several processes but no process group (they were not launched together).
    """
    import socket

    import torch.distributed as dist

    if dist.is_initialized():
        return
    if int(getattr(state, "num_processes", 1)) != 1:
        raise RuntimeError(
            "Megatron-LM needs torch.distributed across its processes: launch with `accelerando launch` or torchrun"
        )

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    start(
        device=state.device,
        default_backend="nccl",
        main_address="127.0.0.1",
        main_port=port,
        rank=0,
        world_size=1,
    )


def _extra_defaults(extra_args_provider: ExtraArgsProvider | None) -> dict[str, object]:
    # The reference's hook adds options to Megatron-LM's parser; their defaults become arguments.
    if extra_args_provider is None:
        return {}
    parser = argparse.ArgumentParser(add_help=False)
    parser = extra_args_provider(parser) or parser
    return vars(parser.parse_args([]))


def initialize(
    accelerator: MegatronAccelerator,
    extra_args_provider: ExtraArgsProvider | None = None,
    args_defaults: Mapping[str, object] | None = None,
) -> None:
    """Initialise Megatron-LM (arguments, model-parallel groups, seeds) from the plugin's arguments.

    Args:
        accelerator: the Accelerator (its state holds the ``MegatronLMPlugin``).
        extra_args_provider: adds options to an ``argparse`` parser; their defaults join the
            arguments (below the plugin's values).
        args_defaults: further argument values (above the plugin's values).

    Raises:
        MegatronLMUnavailableError: megatron-core or CUDA is missing.
        RuntimeError: no Megatron-LM plugin, or several processes without a process group.
        ValueError: the process count does not split into the parallel degrees, or an option
            megatron-core cannot honour (see ``config.check_supported``).
    """
    require_megatron_core("megatron_lm.initialize")
    require_cuda("megatron_lm.initialize")
    plugin = _plugin(accelerator)
    _ensure_process_group(accelerator.state)
    args = build_args(
        {**_extra_defaults(extra_args_provider), **plugin.megatron_lm_default_args}, args_defaults
    )
    check_supported(args)
    set_args(args)
    init_model_parallel(args)
    finish_mpu_init()


def finish_mpu_init() -> None:
    """Seed this process for megatron-core: the CPU and CUDA generators, and the tensor-parallel RNG tracker.

    Tensor-parallel ranks get different dropout streams and the same weights where they must
    (megatron-core's ``model_parallel_cuda_manual_seed``); pipeline stages get distinct seeds.

    Raises:
        MegatronLMUnavailableError: megatron-core or CUDA is missing.
        RuntimeError: Megatron-LM's arguments are not initialised.
    """
    require_megatron_core("megatron_lm.finish_mpu_init")
    require_cuda("megatron_lm.finish_mpu_init")
    import random

    import numpy as np
    from megatron.core import parallel_state as ps  # type: ignore[import-not-found]
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed  # type: ignore[import-not-found]

    seed = int(get_args().seed) + 100 * ps.get_pipeline_model_parallel_rank()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)


def model_provider_func(
    pre_process: bool = True, post_process: bool = True, add_encoder: bool = True, add_decoder: bool = True
) -> MegatronModule:
    """Build megatron-core's GPT / BERT / T5 model (per ``model_type_name``) for this pipeline stage.

    The virtual pipeline stage is read from megatron-core's parallel state (set by the caller
    around each chunk under an interleaved schedule).

    Raises:
        MegatronLMUnavailableError: megatron-core is missing.
        RuntimeError: Megatron-LM's arguments are not initialised.
        ValueError: see :func:`accelerando.backends.strategies.megatron.models.build_model`.
    """
    require_megatron_core("megatron_lm.model_provider_func")
    from megatron.core import parallel_state as ps  # type: ignore[import-not-found]

    args = get_args()
    vp_stage = None
    if args.virtual_pipeline_model_parallel_size is not None:
        vp_stage = ps.get_virtual_pipeline_model_parallel_rank()
    return build_model(
        args, transformer_config(args), pre_process, post_process, add_encoder, add_decoder, vp_stage=vp_stage
    )


def _wrap_chunks(chunks: list[MegatronModule], args: SimpleNamespace) -> list[MegatronModule]:
    """Move each chunk to this GPU, wrap it for fp16/bf16, then in megatron-core's DDP (in that order:
    DDP's gradient buffers take the dtype and device of the parameters it sees).
    """
    from megatron.core.distributed import DistributedDataParallel  # type: ignore[import-not-found]
    from megatron.core.transformer.module import Float16Module  # type: ignore[import-not-found]

    wrapped: list[MegatronModule] = []
    for index, chunk in enumerate(chunks):
        chunk.cuda(torch.cuda.current_device())
        config = chunk.config
        if args.fp16 or args.bf16:
            chunk = Float16Module(config, chunk)
        ddp = DistributedDataParallel(
            config=config,
            ddp_config=ddp_config(args),
            module=chunk,
            # Only the first chunk overlaps its reduction with the backward of later micro-batches.
            disable_bucketing=index > 0,
        )
        ddp.broadcast_params()
        wrapped.append(ddp)
    return wrapped


def _config_overrides(
    args: SimpleNamespace, config: OptimizerConfig
) -> dict[ParamKey, ParamGroupOverride] | None:
    """The plugin's ``no_wd_decay_cond`` / ``scale_lr_cond`` / ``lr_mult`` as megatron-core parameter-group overrides."""
    from megatron.core.optimizer import get_standard_config_overrides  # type: ignore[import-not-found]
    from megatron.core.optimizer.optimizer_config import (  # type: ignore[import-not-found]
        ParamKey,
        ParamWithNamePredicate,
    )

    no_wd = getattr(args, "no_wd_decay_cond", None)
    scale_lr = getattr(args, "scale_lr_cond", None)
    if no_wd is None and scale_lr is None:
        return None
    overrides: dict[ParamKey, ParamGroupOverride] = (
        {} if no_wd is not None else dict(get_standard_config_overrides(config))
    )
    if no_wd is not None:
        key = ParamKey(
            with_name_predicate=ParamWithNamePredicate("no_wd_decay_cond", lambda p, n: no_wd(n, p))
        )
        # megatron-core's ParamGroupOverride is declared total, yet its own docs build it with some keys.
        overrides[key] = {"wd_mult": 0.0}  # pyright: ignore[reportArgumentType]
    if scale_lr is not None:
        mult = float(getattr(args, "lr_mult", 1.0))
        assert config.lr is not None and config.min_lr is not None, "optimizer_config sets both"
        key = ParamKey(
            with_name_predicate=ParamWithNamePredicate("scale_lr_cond", lambda p, n: scale_lr(n, p))
        )
        overrides[key] = {"max_lr": config.lr * mult, "min_lr": config.min_lr * mult}  # pyright: ignore[reportArgumentType]
    return overrides


def prepare_optimizer(accelerator: object, model: list[MegatronModule]) -> MegatronOptimizer:
    """Build megatron-core's optimizer (Adam or SGD, mixed-precision and distributed variants) for ``model``.

    Args:
        accelerator: the Accelerator (unused; kept for the reference's signature).
        model: the DDP-wrapped model chunks.

    Raises:
        MegatronLMUnavailableError: megatron-core or CUDA is missing.
        ValueError: no learning rate in the arguments.
    """
    require_megatron_core("megatron_lm.prepare_optimizer")
    require_cuda("megatron_lm.prepare_optimizer")
    from megatron.core.optimizer import get_megatron_optimizer  # type: ignore[import-not-found]

    args = get_args()
    config = optimizer_config(args)
    return get_megatron_optimizer(config, list(model), config_overrides=_config_overrides(args, config))


def prepare_scheduler(
    accelerator: object, optimizer: MegatronOptimizer, scheduler: object
) -> OptimizerParamScheduler:
    """Build megatron-core's learning-rate / weight-decay schedule (``OptimizerParamScheduler``).

    Args:
        accelerator: the Accelerator (unused; kept for the reference's signature).
        optimizer: megatron-core's optimizer.
        scheduler: the user's ``MegatronLMDummyScheduler`` (its values already in the arguments) or None.

    Raises:
        MegatronLMUnavailableError: megatron-core is missing.
    """
    require_megatron_core("megatron_lm.prepare_scheduler")
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler  # type: ignore[import-not-found]

    return OptimizerParamScheduler(optimizer, **scheduler_steps(get_args()))


def prepare_model_optimizer_scheduler(
    accelerator: MegatronAccelerator,
) -> tuple[list[MegatronModule], MegatronOptimizer, OptimizerParamScheduler]:
    """Build Megatron's model chunks, optimizer and schedule from the plugin's arguments.

    The model comes from the plugin's ``custom_prepare_model_function(custom_model_provider_function)``
    when set, else from ``custom_model_provider_function`` or :func:`model_provider_func` per stage.

    Raises:
        MegatronLMUnavailableError: megatron-core or CUDA is missing.
        ValueError: ``custom_prepare_model_function`` without ``custom_model_provider_function``;
            see :func:`prepare_optimizer` and :func:`model_provider_func`.
    """
    require_megatron_core("megatron_lm.prepare_model_optimizer_scheduler")
    require_cuda("megatron_lm.prepare_model_optimizer_scheduler")

    plugin = _plugin(accelerator)
    args = get_args()
    # The plugin's callables are the user's: a provider returns a model chunk (a MegatronModule).
    provider = cast(
        "Callable[..., MegatronModule]", plugin.custom_model_provider_function or model_provider_func
    )
    if plugin.custom_prepare_model_function is not None:
        if plugin.custom_model_provider_function is None:
            raise ValueError(
                "MegatronLMPlugin.custom_prepare_model_function needs custom_model_provider_function too "
                "(it is called with the provider)"
            )
        made = plugin.custom_prepare_model_function(provider)
        model = cast("list[MegatronModule]", list(made) if isinstance(made, (list, tuple)) else [made])
    else:
        model = _wrap_chunks(build_model_chunks(provider, args), args)
    optimizer = prepare_optimizer(accelerator, model)
    scheduler = prepare_scheduler(accelerator, optimizer, None)
    args.model_len = len(model)
    return model, optimizer, scheduler


@overload
def prepare_data_loader(
    accelerator: MegatronAccelerator, dataloader: MegatronLMDummyDataLoader
) -> tuple[Iterator[object] | None, Iterator[object] | None, Iterator[object] | None]: ...
@overload
def prepare_data_loader(
    accelerator: MegatronAccelerator, dataloader: torch.utils.data.DataLoader[object]
) -> Iterable[object]: ...
def prepare_data_loader(
    accelerator: MegatronAccelerator,
    dataloader: torch.utils.data.DataLoader[object] | MegatronLMDummyDataLoader,
) -> Iterable[object] | tuple[Iterator[object] | None, Iterator[object] | None, Iterator[object] | None]:
    """Rebuild ``dataloader`` for Megatron's data-parallel ranks: each batch holds every micro-batch of one step.

    A torch ``DataLoader`` is re-made with ``micro_batch_size * num_micro_batches`` samples per batch
    and sharded over megatron-core's data-parallel group only (the ranks of one tensor / pipeline
    group read the same data). A ``MegatronLMDummyDataLoader`` gives the train / valid / test
    iterators of the plugin's ``custom_megatron_datasets_provider_function``.

    Raises:
        MegatronLMUnavailableError: megatron-core is missing.
        RuntimeError: Megatron-LM is not initialised.
    """
    require_megatron_core("megatron_lm.prepare_data_loader")
    from megatron.core import parallel_state as ps  # type: ignore[import-not-found]

    args = get_args()
    if isinstance(dataloader, MegatronLMDummyDataLoader):
        return dataloader.build_train_valid_test_data_iterators(accelerator)
    rebuilt = torch.utils.data.DataLoader(
        dataloader.dataset,
        batch_size=int(args.micro_batch_size) * int(args.num_micro_batches),
        shuffle=isinstance(getattr(dataloader, "sampler", None), torch.utils.data.RandomSampler),
        collate_fn=dataloader.collate_fn,
        num_workers=dataloader.num_workers,
        pin_memory=dataloader.pin_memory,
        drop_last=dataloader.drop_last,
        generator=getattr(dataloader, "generator", None),
    )
    return shard_loader(
        rebuilt,
        device=accelerator.state.device,
        num_processes=ps.get_data_parallel_world_size(),
        process_index=ps.get_data_parallel_rank(),
        put_on_device=True,
    )
