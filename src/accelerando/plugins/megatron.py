"""MegatronLMPlugin: the Megatron-LM settings and the Megatron-LM arguments they stand for.

Training through megatron-core needs CUDA GPUs: an Accelerator with this plugin builds, and its
``prepare`` builds the Megatron-LM engine, or, without megatron-core or CUDA, refuses naming the
torch-native alternatives (``ParallelismConfig(tp_size=...)``, ``PipelineParallelPlugin``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, SupportsInt

from accelerando.core.settings import fill_unset
from accelerando.plugins.kwargs_handler import KwargsHandler
from accelerando.plugins.megatron_parsers import parse_model_config

if TYPE_CHECKING:
    import torch

__all__ = ["MegatronLMPlugin"]


@dataclass
class MegatronLMPlugin(KwargsHandler):
    """The reference's Megatron-LM options (tensor / pipeline degrees, micro-batches, recompute, ...).

    Raises:
        ValueError: a degree below 1, or an unknown recompute granularity / method.
    """

    tp_degree: int | None = None
    pp_degree: int | None = None
    use_custom_fsdp: bool | None = None
    overlap_cpu_optimizer_d2h_h2d: bool | None = None
    no_load_optim: bool | None = None
    eod_mask_loss: bool | None = None
    no_save_optim: bool | None = None
    optimizer_cpu_offload: bool | None = None
    use_precision_aware_optimizer: bool | None = None
    decoder_last_pipeline_num_layers: int | None = None
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    attention_backend: bool | None = None
    expert_model_parallel_size: int | None = None
    context_parallel_size: int | None = None
    attention_dropout: float | None = None
    hidden_dropout: float | None = None
    attention_softmax_in_fp32: bool | None = None
    expert_tensor_parallel_size: int | None = None
    calculate_per_token_loss: bool | None = None
    use_rotary_position_embeddings: bool | None = None
    num_micro_batches: int | None = None
    gradient_clipping: float | None = None
    sequence_parallelism: bool | None = None
    recompute_activations: bool | None = None
    use_distributed_optimizer: bool | None = None
    pipeline_model_parallel_split_rank: int | None = None
    num_layers_per_virtual_pipeline_stage: int | None = None
    is_train_batch_min: bool = True
    train_iters: int | None = None
    train_samples: int | None = None
    weight_decay_incr_style: str = "constant"
    start_weight_decay: float | None = None
    end_weight_decay: float | None = None
    lr_decay_style: str = "linear"
    lr_decay_iters: int | None = None
    lr_decay_samples: int | None = None
    lr_warmup_iters: int | None = None
    lr_warmup_samples: int | None = None
    lr_warmup_fraction: float | None = None
    min_lr: float = 0.0
    consumed_samples: list[int] | None = None
    no_wd_decay_cond: Callable[..., bool] | None = None
    scale_lr_cond: Callable[..., bool] | None = None
    lr_mult: float = 1.0
    megatron_dataset_flag: bool = False
    seq_length: int | None = None
    encoder_seq_length: int | None = None
    decoder_seq_length: int | None = None
    tensorboard_dir: str | None = None
    set_all_logging_options: bool = False
    eval_iters: int = 100
    eval_interval: int = 1000
    return_logits: bool = False
    custom_train_step_class: type | None = None
    custom_train_step_kwargs: dict[str, object] | None = None
    custom_model_provider_function: Callable[..., object] | None = None
    custom_prepare_model_function: Callable[..., object] | None = None
    custom_megatron_datasets_provider_function: Callable[..., object] | None = None
    custom_get_batch_function: Callable[..., object] | None = None
    custom_loss_function: Callable[..., object] | None = None
    other_megatron_args: dict[str, object] | None = field(default=None)

    def __post_init__(self) -> None:
        # Unset fields come from the launcher (``--megatron_lm_tp_degree`` ...), then the degrees default to 1.
        fill_unset(self, "megatron", prefix="megatron_lm_")
        for name in ("tp_degree", "pp_degree", "num_micro_batches"):
            if getattr(self, name) is None:
                setattr(self, name, 1)
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"MegatronLMPlugin.{name} must be an integer >= 1, got {value!r}")
        if self.recompute_granularity not in (None, "full", "selective"):
            raise ValueError(
                f"MegatronLMPlugin.recompute_granularity={self.recompute_granularity!r}; use 'full' or 'selective'"
            )
        if self.recompute_method not in (None, "uniform", "block"):
            raise ValueError(
                f"MegatronLMPlugin.recompute_method={self.recompute_method!r}; use 'uniform' or 'block'"
            )
        self.megatron_lm_default_args: dict[str, object] = self._default_args()

    def _default_args(self) -> dict[str, object]:
        """The Megatron-LM command-line arguments these fields stand for (names as Megatron spells them)."""
        args: dict[str, object] = {
            "tensor_model_parallel_size": self.tp_degree,
            "pipeline_model_parallel_size": self.pp_degree,
            "pipeline_model_parallel_split_rank": self.pipeline_model_parallel_split_rank,
            "num_layers_per_virtual_pipeline_stage": self.num_layers_per_virtual_pipeline_stage,
            "DDP_impl": "local" if self.use_distributed_optimizer else "torch",
            "use_distributed_optimizer": bool(self.use_distributed_optimizer),
            "sequence_parallel": bool(self.sequence_parallelism),
            "clip_grad": self.gradient_clipping if self.gradient_clipping is not None else 1.0,
            "num_micro_batches": self.num_micro_batches,
            "consumed_samples": self.consumed_samples,
            "no_wd_decay_cond": self.no_wd_decay_cond,
            "scale_lr_cond": self.scale_lr_cond,
            "lr_mult": self.lr_mult,
            "megatron_dataset_flag": self.megatron_dataset_flag,
            "eval_iters": self.eval_iters,
            "eval_interval": self.eval_interval,
        }
        if self.recompute_activations:
            args["recompute_granularity"] = "selective"  # the older switch means selective recompute
        optional = (
            "use_custom_fsdp", "overlap_cpu_optimizer_d2h_h2d", "no_load_optim", "eod_mask_loss", "no_save_optim",
            "optimizer_cpu_offload", "use_precision_aware_optimizer", "decoder_last_pipeline_num_layers",
            "recompute_granularity", "recompute_method", "recompute_num_layers", "attention_backend",
            "expert_model_parallel_size", "context_parallel_size", "attention_dropout", "hidden_dropout",
            "attention_softmax_in_fp32", "expert_tensor_parallel_size", "calculate_per_token_loss",
            "use_rotary_position_embeddings", "tensorboard_dir",
        )  # fmt: skip
        for name in optional:
            value = getattr(self, name)
            if value is not None:
                args[name] = value
        if self.other_megatron_args:
            args.update(self.other_megatron_args)
        return args

    def set_network_size_args(
        self, model: object, batch_data: Mapping[str, torch.Tensor] | None = None
    ) -> None:
        """Fill the architecture arguments (layers, hidden size, heads, vocabulary, lengths) from ``model.config``.

        Raises:
            ValueError: no parser for the model's family (see ``accelerando.plugins.megatron_parsers``).
        """
        parse_model_config(self, model, batch_data)

    def set_mixed_precision(self, mixed_precision: str) -> None:
        """Turn on Megatron-LM's fp16 (with its dynamic loss scaler) or bf16 arguments.

        Raises:
            ValueError: a value other than "no", "fp16", "bf16".
        """
        value = str(getattr(mixed_precision, "value", mixed_precision)).lower()
        if value == "fp16":
            self.megatron_lm_default_args["fp16"] = True
        elif value == "bf16":
            self.megatron_lm_default_args["bf16"] = True
            self.megatron_lm_default_args["accumulate_allreduce_grads_in_fp32"] = True
        elif value != "no":
            raise ValueError(
                f"Megatron-LM supports mixed precision 'no', 'fp16' or 'bf16', not {mixed_precision!r}"
            )

    def set_training_args(self, micro_batch_size: int, dp_degree: int) -> None:
        """Batch arguments: micro-batch size, data-parallel size, global batch size, train length."""
        args = self.megatron_lm_default_args
        args["data_parallel_size"] = dp_degree
        args["micro_batch_size"] = micro_batch_size
        micro_batches = self.num_micro_batches
        assert micro_batches is not None  # __post_init__ defaults it to 1
        args["global_batch_size"] = micro_batch_size * dp_degree * micro_batches
        for name in ("train_iters", "train_samples"):
            if getattr(self, name) is not None:
                args[name] = getattr(self, name)

    def set_optimizer_type(self, optimizer: object) -> None:
        """Optimizer arguments from a torch optimizer (Adam family or SGD): lr, weight decay, betas/momentum.

        Raises:
            ValueError: an optimizer Megatron-LM cannot rebuild (the message names it).
        """
        name = type(optimizer).__name__.lower()
        defaults = dict(getattr(optimizer, "defaults", {}))
        args = self.megatron_lm_default_args
        if "adam" in name:
            args["optimizer"] = "adam"
            betas = defaults.get("betas", (0.9, 0.999))
            args["adam_beta1"], args["adam_beta2"] = float(betas[0]), float(betas[1])
            args["adam_eps"] = defaults.get("eps", 1e-8)
        elif "sgd" in name:
            args["optimizer"] = "sgd"
            args["sgd_momentum"] = defaults.get("momentum", 0.0)
        else:
            raise ValueError(
                f"Megatron-LM builds Adam or SGD optimizers; {type(optimizer).__name__} is not supported"
            )
        args["lr"] = defaults.get("lr")
        args["weight_decay"] = defaults.get("weight_decay", 0.0)

    def set_scheduler_args(self, scheduler: object) -> None:
        """Learning-rate schedule arguments from a ``MegatronLMDummyScheduler`` and the plugin's fields."""
        args = self.megatron_lm_default_args
        total = getattr(scheduler, "total_num_steps", None)
        warmup = getattr(scheduler, "warmup_num_steps", 0)

        def dp_degree() -> int:
            value = args.get("data_parallel_size", 1)
            if not isinstance(value, (str, SupportsInt)):
                raise TypeError(f"data_parallel_size must be an integer, got {value!r}")
            return max(int(value), 1)

        if self.train_iters is None and total is not None:
            self.train_iters = total // dp_degree()
        if self.train_iters is not None:
            args["train_iters"] = self.train_iters
        if self.lr_warmup_iters is None and warmup:
            self.lr_warmup_iters = warmup // dp_degree()
        for name in (
            "lr_decay_style", "lr_decay_iters", "lr_decay_samples", "lr_warmup_iters", "lr_warmup_samples",
            "lr_warmup_fraction", "min_lr", "start_weight_decay", "end_weight_decay", "weight_decay_incr_style",
        ):  # fmt: skip
            value = getattr(self, name)
            if value is not None:
                args[name] = value

    def set_tensorboard_logging_options(self) -> None:
        """With ``set_all_logging_options``, turn on every Megatron-LM TensorBoard logging switch."""
        if not self.set_all_logging_options:
            return
        for name in (
            "log_params_norm", "log_num_zeros_in_grad", "log_timers_to_tensorboard", "log_batch_size_to_tensorboard",
            "log_learning_rate_to_tensorboard", "log_loss_scale_to_tensorboard", "log_validation_ppl_to_tensorboard",
            "log_memory_to_tensorboard", "log_world_size_to_tensorboard",
        ):  # fmt: skip
            self.megatron_lm_default_args[name] = True
