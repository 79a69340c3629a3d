"""MegatronLMPlugin: Megatron-LM tensor/pipeline parallel settings (configuration only for now).

Training through megatron-core needs CUDA GPUs; building an Accelerator with this plugin on a machine
without them fails clearly in the connector's strategy lookup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from accelerando.plugins.kwargs import KwargsHandler
from accelerando.settings import fill_unset

__all__ = ["MegatronLMPlugin"]


@dataclass
class MegatronLMPlugin(KwargsHandler):
    """The reference's Megatron-LM options (tensor / pipeline degrees, micro-batches, recompute, ...).

    Raises:
        ValueError: a degree below 1.
    """

    tp_degree: int | None = None
    pp_degree: int | None = None
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
    no_wd_decay_cond: Any = None
    scale_lr_cond: Any = None
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
    custom_train_step_class: Any = None
    custom_train_step_kwargs: dict[str, Any] | None = None
    custom_model_provider_function: Any = None
    custom_prepare_model_function: Any = None
    custom_megatron_datasets_provider_function: Any = None
    custom_get_batch_function: Any = None
    custom_loss_function: Any = None
    other_megatron_args: dict[str, Any] | None = field(default=None)

    def __post_init__(self) -> None:
        # Unset fields come from the launcher (``--megatron_lm_tp_degree`` ...), then the degrees default to 1.
        fill_unset(self, "megatron", prefix="megatron_lm_")
        for name in ("tp_degree", "pp_degree", "num_micro_batches"):
            if getattr(self, name) is None:
                setattr(self, name, 1)
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"MegatronLMPlugin.{name} must be an integer >= 1, got {value!r}")
