"""Tensor parallelism, single process: the strategy rule, plans, head checks and the plugin."""

from __future__ import annotations

import pytest
import torch

from accelerando.backends.connector import decide
from accelerando.backends.strategies import STRATEGIES, strategy_class
from accelerando.backends.strategies.composable.checks import check_heads
from accelerando.backends.strategies.composable.plan import module_plan, resolve_plan, to_parallel_style
from accelerando.core.enums import DistributedType
from accelerando.parallelism_config import ParallelismConfig
from accelerando.plugins.tensor_parallel import TorchTensorParallelPlugin


def _decide(parallelism=None, *, deepspeed=False, fsdp=False, megatron=False, n=2):
    return decide(
        num_processes=n,
        process_type=DistributedType.MULTI_CPU if n > 1 else DistributedType.NO,
        deepspeed_requested=deepspeed,
        fsdp_requested=fsdp,
        megatron_requested=megatron,
        requested_type=None,
        parallelism=parallelism,
    )


def test_tp_size_2_is_never_plain_ddp():
    decision = _decide(ParallelismConfig(tp_size=2))
    assert decision.strategy_name == "composable" and decision.strategy_name != "ddp"
    assert decision.distributed_type is DistributedType.MULTI_CPU
    assert "tp=2" in decision.reason
    assert STRATEGIES["composable"].endswith(":ComposableStrategy")
    assert strategy_class("composable").__name__ == "ComposableStrategy"


def test_mesh_rule_sharding_and_conflicts():
    shard = _decide(ParallelismConfig(dp_shard_size=2, tp_size=2), n=4)
    assert (shard.strategy_name, shard.distributed_type) == ("composable", DistributedType.FSDP)
    assert _decide(ParallelismConfig(dp_shard_size=2)).strategy_name == "composable"
    # plain sharding with an FSDP plugin stays with the FSDP strategy; HSDP goes on the mesh
    assert _decide(ParallelismConfig(dp_shard_size=2), fsdp=True).strategy_name == "fsdp"
    hsdp = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)
    assert _decide(hsdp, fsdp=True, n=4).strategy_name == "composable"
    # replication only (what an all-ones config becomes) is DDP
    assert _decide(ParallelismConfig(dp_replicate_size=2)).strategy_name == "ddp"
    with pytest.raises(ValueError, match="tp_size=2.*DeepSpeed"):
        _decide(ParallelismConfig(tp_size=2), deepspeed=True)
    with pytest.raises(ValueError, match="Megatron-LM.*tp_degree"):
        _decide(ParallelismConfig(tp_size=2), megatron=True)


def test_mesh_size_mismatch_names_numbers():
    with pytest.raises(
        ValueError, match=r"dp_shard=2 x tp=2 .*= 4 processes but the job has 2; change the sizes"
    ):
        ParallelismConfig(dp_shard_size=2, tp_size=2).validate(2)


def _llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return transformers.LlamaForCausalLM(config)


def test_transformers_plan_resolves_to_torch_styles():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    model = _llama()
    plan = module_plan(model)
    assert plan["model.layers.*.self_attn.q_proj"] == "colwise"
    resolved = resolve_plan(model, plan)
    assert "model.layers.1.mlp.down_proj" in resolved and "lm_head" in resolved
    assert len([k for k in resolved if ".layers." in k]) == 14
    styles = {name: to_parallel_style(s, model.get_submodule(name), name) for name, s in resolved.items()}
    assert isinstance(styles["model.layers.0.self_attn.q_proj"], ColwiseParallel)
    assert isinstance(styles["model.layers.0.self_attn.o_proj"], RowwiseParallel)
    assert isinstance(styles["model.embed_tokens"], RowwiseParallel)  # vocabulary rows split


def test_plan_errors():
    model = _llama()
    with pytest.raises(ValueError, match="names a submodule"):
        resolve_plan(model, {"encoder.*.dense": "colwise"})
    with pytest.raises(ValueError, match="unknown style 'diagonal'"):
        to_parallel_style("diagonal", model.lm_head, "lm_head")
    norm = model.model.norm
    with pytest.raises(ValueError, match="nn.Linear / nn.Embedding"):
        to_parallel_style("colwise", norm, "model.norm")
    assert to_parallel_style("replicate", norm, "model.norm") is None
    assert module_plan(torch.nn.Linear(2, 2)) == {}


def test_heads_must_divide():
    model = _llama()
    check_heads(model, 2)
    with pytest.raises(
        ValueError, match=r"tp_size=4 does not divide LlamaConfig.num_key_value_heads=2.*\[1, 2\]"
    ):
        check_heads(model, 4)
    with pytest.raises(ValueError, match="num_attention_heads=4"):
        check_heads(model, 3)


def test_plugin_fields_and_sizes():
    plugin = TorchTensorParallelPlugin(tp_size=2, tp_plan={"proj": "colwise"})
    assert plugin.parallelism_sizes(4) == {"tp_size": 2, "dp_shard_size": 2}
    assert TorchTensorParallelPlugin(tp_size=2).parallelism_sizes(2) == {"tp_size": 2, "dp_shard_size": 1}
    with pytest.raises(ValueError, match="does not divide the job's 3"):
        plugin.parallelism_sizes(3)
    with pytest.raises(ValueError, match="tp_size must be an integer"):
        TorchTensorParallelPlugin(tp_size=0)
    with pytest.raises(ValueError, match="tp_plan must map"):
        TorchTensorParallelPlugin(tp_size=2, tp_plan=["proj"])


def test_composable_strategy_needs_a_mesh():
    from types import SimpleNamespace

    cls = strategy_class("composable")
    runtime = SimpleNamespace(
        distributed_type=DistributedType.NO, mesh=None, plugins=SimpleNamespace(parallelism_config=None)
    )
    with pytest.raises(ValueError, match="ParallelismConfig"):
        cls(runtime, None)


def test_tensor_parallel_plugin_becomes_a_mesh_config():
    import accelerando.core.runtime as rt
    from accelerando.backends.connector import _fold_tensor_parallel_plugin

    folded = _fold_tensor_parallel_plugin(rt.Plugins(torch_tp=TorchTensorParallelPlugin(tp_size=2)), 4)
    config = folded.parallelism_config
    assert (config.tp_size, config.dp_shard_size, config.dp_replicate_size) == (2, 2, 1)
    assert _decide(config, n=4).strategy_name == "composable"
    plain = rt.Plugins(torch_tp=TorchTensorParallelPlugin(tp_size=1))
    assert _fold_tensor_parallel_plugin(plain, 2) is plain
    both = rt.Plugins(
        torch_tp=TorchTensorParallelPlugin(tp_size=2), parallelism_config=ParallelismConfig(tp_size=4)
    )
    with pytest.raises(ValueError, match=r"tp_size=2\) and ParallelismConfig\(tp_size=4\) disagree"):
        _fold_tensor_parallel_plugin(both, 4)
