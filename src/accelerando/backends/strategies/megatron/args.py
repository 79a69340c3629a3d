"""The Megatron-LM arguments of this process: the plugin's ``megatron_lm_default_args`` with defaults and derived sizes.

Megatron-LM reads one global argument namespace; :func:`initialize` builds it once per process from
the plugin, and the model providers, the engine and the data loaders read it with :func:`get_args`.
Building the namespace is plain Python (no megatron-core), so it is checked on any machine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import SimpleNamespace

__all__ = ["ARG_DEFAULTS", "build_args", "clear_args", "get_args", "set_args"]

#: Values Megatron-LM assumes when the plugin does not set them (names as Megatron spells them).
ARG_DEFAULTS: dict[str, object] = {
    "seed": 1234,
    "make_vocab_size_divisible_by": 128,
    "init_method_std": 0.02,
    "micro_batch_size": 1,
    "num_micro_batches": 1,
    "data_parallel_size": 1,
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "context_parallel_size": 1,
    "expert_model_parallel_size": 1,
    "expert_tensor_parallel_size": None,
    "num_layers_per_virtual_pipeline_stage": None,
    "sequence_parallel": False,
    "use_distributed_optimizer": False,
    "fp16": False,
    "bf16": False,
    "accumulate_allreduce_grads_in_fp32": False,
    "clip_grad": 1.0,
    "optimizer": "adam",
    "lr": None,
    "min_lr": 0.0,
    "weight_decay": 0.0,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "adam_eps": 1e-8,
    "sgd_momentum": 0.9,
    "train_iters": None,
    "train_samples": None,
    "lr_decay_style": "linear",
    "lr_decay_iters": None,
    "lr_decay_samples": None,
    "lr_warmup_iters": 0,
    "lr_warmup_samples": 0,
    "lr_warmup_fraction": None,
    "start_weight_decay": None,
    "end_weight_decay": None,
    "weight_decay_incr_style": "constant",
    "model_type_name": "gpt",
    "pretraining_flag": True,
    "bert_binary_head": True,
    "num_labels": 2,
    "seq_length": None,
    "encoder_seq_length": None,
    "decoder_seq_length": None,
    "max_position_embeddings": None,
    "orig_vocab_size": None,
    "megatron_dataset_flag": False,
    "return_logits": False,
    "eval_iters": 100,
    "eval_interval": 1000,
    "no_save_optim": False,
    "no_load_optim": False,
    "consumed_samples": None,
}

_ARGS: SimpleNamespace | None = None


def _padded_vocab_size(orig: int, divisible_by: int, tp: int) -> int:
    # Megatron pads the vocabulary so that each tensor-parallel shard has a multiple of ``divisible_by`` rows.
    multiple = divisible_by * tp
    return int(math.ceil(orig / multiple) * multiple)


def build_args(
    default_args: Mapping[str, object], extra: Mapping[str, object] | None = None
) -> SimpleNamespace:
    """Merge :data:`ARG_DEFAULTS`, the plugin's arguments and ``extra`` (later wins) and derive sizes.

    Derived: ``virtual_pipeline_model_parallel_size`` (layers / pipeline stages / layers per
    virtual stage), ``padded_vocab_size`` and ``global_batch_size``.

    Args:
        default_args: the plugin's ``megatron_lm_default_args``.
        extra: further values (the reference's ``args_defaults`` of ``initialize``).

    Returns:
        The argument namespace.

    Raises:
        ValueError: layers that do not split evenly into the pipeline's virtual stages.
    """
    values = {**ARG_DEFAULTS, **{k: v for k, v in default_args.items() if v is not None}}
    values.update({k: v for k, v in (extra or {}).items() if v is not None})
    args = SimpleNamespace(**values)
    args.virtual_pipeline_model_parallel_size = None
    per_stage = args.num_layers_per_virtual_pipeline_stage
    if per_stage is not None and int(args.pipeline_model_parallel_size) > 1:
        layers = int(getattr(args, "num_layers", 0) or 0)
        stages = int(args.pipeline_model_parallel_size)
        if layers % (stages * int(per_stage)):
            raise ValueError(
                f"num_layers={layers} does not split into {stages} pipeline stages of "
                f"num_layers_per_virtual_pipeline_stage={per_stage} layers; choose sizes that divide it"
            )
        args.virtual_pipeline_model_parallel_size = layers // stages // int(per_stage)
    if args.orig_vocab_size is not None:
        args.padded_vocab_size = _padded_vocab_size(
            int(args.orig_vocab_size),
            int(args.make_vocab_size_divisible_by),
            int(args.tensor_model_parallel_size),
        )
    if getattr(args, "global_batch_size", None) is None:
        args.global_batch_size = (
            int(args.micro_batch_size) * int(args.data_parallel_size) * int(args.num_micro_batches)
        )
    return args


def set_args(args: SimpleNamespace) -> None:
    """Make ``args`` this process's Megatron-LM arguments."""
    global _ARGS
    _ARGS = args


def get_args() -> SimpleNamespace:
    """This process's Megatron-LM arguments.

    Raises:
        RuntimeError: Megatron-LM was not initialised in this process (``prepare`` does it).
    """
    if _ARGS is None:
        raise RuntimeError(
            "Megatron-LM is not initialised in this process: call accelerator.prepare(...) with a "
            "MegatronLMPlugin first (or accelerando.utils.megatron_lm.initialize(accelerator))"
        )
    return _ARGS


def clear_args() -> None:
    """Forget this process's Megatron-LM arguments (tests, teardown)."""
    set_args(None)  # type: ignore[arg-type]
