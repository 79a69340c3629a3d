"""MegatronLMPlugin on CPU: the reference's fields, and the Megatron-LM arguments built from them."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from accelerando.plugins.megatron import MegatronLMPlugin

NEW_FIELDS = (
    "use_custom_fsdp", "overlap_cpu_optimizer_d2h_h2d", "no_load_optim", "eod_mask_loss", "no_save_optim",
    "optimizer_cpu_offload", "use_precision_aware_optimizer", "decoder_last_pipeline_num_layers",
    "recompute_granularity", "recompute_method", "recompute_num_layers", "attention_backend",
    "expert_model_parallel_size", "context_parallel_size", "attention_dropout", "hidden_dropout",
    "attention_softmax_in_fp32", "expert_tensor_parallel_size", "calculate_per_token_loss",
    "use_rotary_position_embeddings",
)  # fmt: skip


def test_every_reference_field_exists_and_reaches_the_arguments():
    names = {f.name for f in dataclasses.fields(MegatronLMPlugin)}
    assert set(NEW_FIELDS) <= names
    plugin = MegatronLMPlugin(
        tp_degree=2, pp_degree=2, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1,
        context_parallel_size=2, expert_model_parallel_size=4, hidden_dropout=0.0, eod_mask_loss=True,
        other_megatron_args={"seed": 7},
    )  # fmt: skip
    args = plugin.megatron_lm_default_args
    assert args["tensor_model_parallel_size"] == 2 and args["pipeline_model_parallel_size"] == 2
    assert args["recompute_granularity"] == "full" and args["recompute_num_layers"] == 1
    assert args["context_parallel_size"] == 2 and args["expert_model_parallel_size"] == 4
    assert args["hidden_dropout"] == 0.0 and args["eod_mask_loss"] is True and args["seed"] == 7
    assert "use_custom_fsdp" not in args  # unset fields stay Megatron's defaults


def test_bad_recompute_values_are_refused():
    with pytest.raises(ValueError, match="recompute_granularity"):
        MegatronLMPlugin(recompute_granularity="most")
    with pytest.raises(ValueError, match="recompute_method"):
        MegatronLMPlugin(recompute_method="random")


def test_precision_training_optimizer_scheduler_and_logging_arguments():
    plugin = MegatronLMPlugin(num_micro_batches=2, lr_warmup_iters=None, set_all_logging_options=True)
    plugin.set_mixed_precision("fp16")
    assert plugin.megatron_lm_default_args["fp16"] is True
    with pytest.raises(ValueError, match="'no', 'fp16' or 'bf16'"):
        plugin.set_mixed_precision("fp8")
    plugin.set_training_args(micro_batch_size=4, dp_degree=2)
    assert plugin.megatron_lm_default_args["global_batch_size"] == 16
    sgd = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1, momentum=0.9)
    plugin.set_optimizer_type(sgd)
    assert plugin.megatron_lm_default_args["optimizer"] == "sgd"
    assert plugin.megatron_lm_default_args["sgd_momentum"] == 0.9
    with pytest.raises(ValueError, match="Adam or SGD"):
        plugin.set_optimizer_type(torch.optim.Adagrad(torch.nn.Linear(2, 2).parameters()))
    plugin.set_scheduler_args(SimpleNamespace(total_num_steps=100, warmup_num_steps=10))
    assert plugin.megatron_lm_default_args["train_iters"] == 50  # steps over the 2 data-parallel processes
    assert plugin.megatron_lm_default_args["lr_warmup_iters"] == 5
    plugin.set_tensorboard_logging_options()
    assert plugin.megatron_lm_default_args["log_timers_to_tensorboard"] is True


def test_network_size_arguments_from_a_model_config():
    config = SimpleNamespace(
        model_type="gpt2", n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=16,
        max_position_embeddings=16, num_hidden_layers=2, hidden_size=16, num_attention_heads=2,
    )  # fmt: skip
    plugin = MegatronLMPlugin()
    plugin.set_network_size_args(SimpleNamespace(config=config), {"input_ids": torch.zeros(2, 8)})
    args = plugin.megatron_lm_default_args
    assert args["num_layers"] == 2 and args["hidden_size"] == 16 and args["num_attention_heads"] == 2
