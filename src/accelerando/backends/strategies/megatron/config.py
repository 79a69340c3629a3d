"""megatron-core's configuration objects made from the Megatron-LM arguments (see ``args.py``).

``transformer_config`` -> ``TransformerConfig`` (architecture, parallel sizes, precision, recompute),
``optimizer_config`` -> ``OptimizerConfig``, ``ddp_config`` -> ``DistributedDataParallelConfig``,
``scheduler_steps`` -> the sample counts of megatron-core's ``OptimizerParamScheduler``.
megatron-core is imported inside the functions that build its objects.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypedDict

import torch

if TYPE_CHECKING:
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import TransformerConfig

__all__ = ["check_supported", "ddp_config", "optimizer_config", "scheduler_steps", "transformer_config"]

# Megatron-LM argument name -> TransformerConfig field, where they differ.
_RENAMED = {
    "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage",
    "num_experts": "num_moe_experts",
}


def check_supported(args: SimpleNamespace) -> None:
    """Refuse the Megatron-LM options this engine cannot honour over megatron-core.

    Raises:
        ValueError: ``pipeline_model_parallel_split_rank`` (megatron-core 0.16 has no encoder/decoder
            split rank) or ``use_custom_fsdp`` (Megatron's own FSDP is not driven by accelerando); the
            message names what to use instead.
    """
    if getattr(args, "pipeline_model_parallel_split_rank", None) is not None:
        raise ValueError(
            "MegatronLMPlugin(pipeline_model_parallel_split_rank=...) splits encoder and decoder stages, which "
            "megatron-core 0.16 no longer supports: leave it unset (T5 runs with pp_degree=1)"
        )
    if getattr(args, "use_custom_fsdp", False):
        raise ValueError(
            "MegatronLMPlugin(use_custom_fsdp=True) asks for Megatron's own FSDP, which accelerando does not drive: "
            "use Megatron's distributed optimizer (use_distributed_optimizer=True) or "
            "Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(...)) without Megatron-LM"
        )


def _params_dtype(args: SimpleNamespace) -> torch.dtype:
    if args.fp16:
        return torch.float16
    if args.bf16:
        return torch.bfloat16
    return torch.float32


def transformer_config(
    args: SimpleNamespace, *, use_cpu_initialization: bool | None = None
) -> TransformerConfig:
    """megatron-core's ``TransformerConfig`` for the model these arguments describe.

    Every argument whose name is a ``TransformerConfig`` field is passed through (the plugin's
    ``other_megatron_args`` reach it this way, e.g. ``normalization="RMSNorm"``); dtypes follow
    ``fp16`` / ``bf16``; ``attention_backend`` may be a name (``"local"``, ``"flash"`` ...).

    Args:
        args: the Megatron-LM arguments.
        use_cpu_initialization: initialise weights on the CPU (default: when CUDA is unavailable).

    Raises:
        ValueError: no architecture (``num_layers`` / ``hidden_size`` / ``num_attention_heads``) in
            the arguments, or an unknown attention backend.
    """
    from megatron.core.transformer import TransformerConfig  # type: ignore[import-not-found]
    from megatron.core.transformer.enums import AttnBackend  # type: ignore[import-not-found]

    missing = [
        n for n in ("num_layers", "hidden_size", "num_attention_heads") if getattr(args, n, None) is None
    ]
    if missing:
        raise ValueError(
            f"The Megatron-LM arguments lack {missing}: prepare a transformers model whose family has a parser "
            "(accelerando.plugins.megatron_parsers) or set them in MegatronLMPlugin(other_megatron_args={...})"
        )
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    # Field name -> value of TransformerConfig's many differently typed fields.
    values: dict[str, Any] = {}
    for name, value in vars(args).items():
        target = _RENAMED.get(name, name)
        if target in fields and value is not None:
            values[target] = value
    dtype = _params_dtype(args)
    values.update(params_dtype=dtype, pipeline_dtype=dtype, fp16=bool(args.fp16), bf16=bool(args.bf16))
    values["virtual_pipeline_model_parallel_size"] = args.virtual_pipeline_model_parallel_size
    values["expert_tensor_parallel_size"] = args.expert_tensor_parallel_size
    backend = values.get("attention_backend")
    if isinstance(backend, bool):
        # The reference's plugin types this as a switch: True = let megatron-core choose.
        values.pop("attention_backend")
    elif isinstance(backend, str):
        try:
            values["attention_backend"] = AttnBackend[backend]
        except KeyError:
            raise ValueError(
                f"attention_backend={backend!r}; use one of {[b.name for b in AttnBackend]}"
            ) from None
    if use_cpu_initialization is None:
        use_cpu_initialization = not torch.cuda.is_available()
    values["use_cpu_initialization"] = use_cpu_initialization
    # Between pipeline stages megatron-core sends activations of a fixed shape unless told that the
    # length varies: Hugging Face batches differ in length (and GPT's inputs are one token shorter
    # than the batch), so pipelines exchange shapes. megatron-core refuses that with its default
    # "allgather" MoE token dispatcher (checked even without experts); "alltoall" is its alternative.
    if int(args.pipeline_model_parallel_size) > 1:
        values.setdefault("variable_seq_lengths", True)
        if values["variable_seq_lengths"]:
            values.setdefault("moe_token_dispatcher_type", "alltoall")
    return TransformerConfig(**values)


def optimizer_config(args: SimpleNamespace) -> OptimizerConfig:
    """megatron-core's ``OptimizerConfig`` (Adam or SGD, learning rate, clipping, precision).

    Raises:
        ValueError: no learning rate (prepare the optimizer together with the model).
    """
    from megatron.core.optimizer import OptimizerConfig  # type: ignore[import-not-found]

    if args.lr is None:
        raise ValueError(
            "Megatron-LM builds its own optimizer and needs its learning rate: pass your torch optimizer "
            "(Adam / AdamW / SGD) to the same accelerator.prepare(...) call as the model"
        )
    fields = {f.name for f in dataclasses.fields(OptimizerConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    values.update(
        lr=float(args.lr),
        min_lr=float(args.min_lr),
        fp16=bool(args.fp16),
        bf16=bool(args.bf16),
        params_dtype=_params_dtype(args),
        clip_grad=float(args.clip_grad),
        use_distributed_optimizer=bool(args.use_distributed_optimizer),
    )
    return OptimizerConfig(**values)


def ddp_config(args: SimpleNamespace) -> DistributedDataParallelConfig:
    """megatron-core's ``DistributedDataParallelConfig`` (fp32 gradient reduction under bf16, distributed optimizer)."""
    from megatron.core.distributed import DistributedDataParallelConfig  # type: ignore[import-not-found]

    fields = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    values["grad_reduce_in_fp32"] = bool(args.accumulate_allreduce_grads_in_fp32)
    values["use_distributed_optimizer"] = bool(args.use_distributed_optimizer)
    return DistributedDataParallelConfig(**values)


class SchedulerSteps(TypedDict):
    """The keyword arguments of megatron-core's ``OptimizerParamScheduler`` that :func:`scheduler_steps` gives."""

    init_lr: float
    max_lr: float
    min_lr: float
    lr_warmup_steps: int
    lr_decay_steps: int
    lr_decay_style: str
    start_wd: float
    end_wd: float
    wd_incr_steps: int
    wd_incr_style: str


def scheduler_steps(args: SimpleNamespace) -> SchedulerSteps:
    """The keyword arguments of megatron-core's ``OptimizerParamScheduler`` (counted in samples).

    Iteration-based runs count ``iters * global_batch_size`` samples; sample-based runs
    (``train_samples``) use the sample counts as they are. Without a schedule (no ``train_iters``,
    ``train_samples`` or ``lr_decay_iters``) the learning rate stays constant.
    """
    gbs = int(args.global_batch_size)
    if args.train_samples is not None:
        decay = args.lr_decay_samples or args.train_samples
        warmup = args.lr_warmup_samples or 0
        wd_steps = args.train_samples
    else:
        iters = args.lr_decay_iters or args.train_iters
        decay = iters * gbs if iters else None
        warmup = (args.lr_warmup_iters or 0) * gbs
        wd_steps = (args.train_iters or 0) * gbs
    style = args.lr_decay_style
    if not decay:
        decay, warmup, style = 1, 0, "constant"
    if args.lr_warmup_fraction is not None:
        warmup = int(args.lr_warmup_fraction * decay)
    weight_decay = float(args.weight_decay)
    return {
        "init_lr": 0.0,  # Megatron-LM's lr_warmup_init
        "max_lr": float(args.lr),
        "min_lr": float(args.min_lr),
        "lr_warmup_steps": int(warmup),
        "lr_decay_steps": int(decay),
        "lr_decay_style": style,
        "start_wd": weight_decay if args.start_weight_decay is None else float(args.start_weight_decay),
        "end_wd": weight_decay if args.end_weight_decay is None else float(args.end_weight_decay),
        "wd_incr_steps": int(wd_steps),
        "wd_incr_style": args.weight_decay_incr_style,
    }
