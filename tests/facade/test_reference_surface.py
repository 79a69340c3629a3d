"""Reference surface of the Accelerator, the state views, ParallelismConfig, plugins and optimizer helpers.

One 2-process launch (gloo) checks the mesh-derived ranks; everything else runs in this process.
"""

from __future__ import annotations

import json
import threading
from collections import namedtuple
from typing import Any

import pytest
import torch
from torch import nn

from accelerando import (
    Accelerator,
    DeepSpeedPlugin,
    DistributedDataParallelKwargs,
    DistributedType,
    FullyShardedDataParallelPlugin,
    ParallelismConfig,
    PartialState,
)
from suite_support import run_distributed_preloaded


# ------------------------------------------------------------------------------ ParallelismConfig
def test_parallelism_config_views_and_sizes() -> None:
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2)
    assert (config.data_parallel_size, config.non_data_parallel_size, config.total_size) == (4, 2, 8)
    assert config.dp_dim_names == ["dp_replicate", "dp_shard"]
    assert config.non_dp_dim_names == ["tp"]
    assert config.dp_shard_cp_dim_names == ["dp_shard"]
    assert config.dp_cp_dim_names == ["dp_replicate", "dp_shard"]
    assert config.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"]
    assert config.active_mesh_dims == ["dp_replicate", "dp_shard", "tp"]
    assert config.dp_replicate_enabled and config.dp_shard_enabled and not config.sp_enabled
    assert (config.cp_backend, config.sp_backend) == ("torch", "deepspeed")
    assert config.tp_handler is not None and config.cp_handler is None  # default options for tp only

    plain = ParallelismConfig()
    assert plain.fsdp_dim_names == ["dp_shard_cp"] and plain.active_mesh_dims == []
    plain.validate(3)  # every size 1 in a job of 3 becomes plain replication
    assert plain.dp_replicate_size == 3 and plain.data_parallel_size == 3


def test_parallelism_config_refusals_env_and_json(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="pure replication"):
        ParallelismConfig(dp_replicate_size=2, tp_size=2)
    with pytest.raises(ValueError, match="exclude each other"):
        ParallelismConfig(dp_shard_size=2, cp_size=2, sp_size=2)
    with pytest.raises(ValueError, match="cp_backend"):
        ParallelismConfig(cp_backend="ring")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sp_size"):
        ParallelismConfig(sp_size=0)
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "4")
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_SIZE", "2")
    from_env = ParallelismConfig()
    assert from_env.dp_shard_size == 4 and from_env.cp_size == 2 and from_env.cp_handler is not None
    assert from_env.dp_shard_cp_dim_names == ["dp_shard", "cp"]
    exported = from_env.to_json()
    json.dumps(exported)  # serialisable: handlers become dicts
    assert exported["dp_shard_size"] == 4 and isinstance(exported["cp_handler"], dict)
    assert "device_mesh" not in exported
    with pytest.raises(ValueError, match="device type"):
        from_env.get_device_mesh()


def test_sequence_parallelism_is_refused_clearly(fresh_state: Any) -> None:
    with pytest.raises(NotImplementedError, match="DeepSpeed Ulysses"):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(sp_size=2))


# ------------------------------------------------------------------------------------- Accelerator
def test_accelerator_mesh_properties_without_a_mesh(fresh_state: Any) -> None:
    accelerator = Accelerator(cpu=True)
    assert accelerator.data_parallel_shard_rank == 0 and accelerator.data_parallel_rank == 0
    assert accelerator.should_save_model is True  # each machine's first process
    assert accelerator.is_composable_parallelism_enabled is False
    with pytest.raises(ValueError, match="sp_size"):
        accelerator.deepspeed_ulysses_dl_adapter([], nn.Linear(1, 1))
    from accelerando import accelerator as module

    assert module.SAFE_WEIGHTS_NAME == "model.safetensors" and module.WEIGHTS_NAME == "pytorch_model.bin"
    assert module.SCALER_NAME == "scaler.pt" and module.FSDP2_PYTORCH_VERSION == "2.6.0"


def test_process_filters_bare_called_and_unbound(fresh_state: Any) -> None:
    accelerator = Accelerator(cpu=True)
    calls: list[str] = []

    @accelerator.on_main_process
    def bare(x: int) -> int:
        calls.append("bare")
        return x

    @accelerator.on_main_process()
    def called() -> None:
        calls.append("called")

    @accelerator.on_last_process()
    def last() -> None:
        calls.append("last")

    @accelerator.on_local_main_process
    def local() -> None:
        calls.append("local")

    @accelerator.on_process(process_index=1)
    def other() -> None:
        calls.append("other")  # a single process does every process's work

    unbound = Accelerator.on_main_process(lambda: calls.append("unbound"))
    assert bare(3) == 3 and bare.__name__ == "bare"
    for fn in (called, last, local, other, unbound):
        fn()
    assert calls == ["bare", "called", "last", "local", "other", "unbound"]
    state = PartialState()

    @state.on_main_process()
    def via_state() -> str:
        return "ran"

    assert via_state() == "ran"
    with pytest.raises(ValueError, match="process_index"):
        state.on_process(lambda: None)


def test_load_state_passes_load_kwargs(fresh_state: Any, tmp_path: Any) -> None:
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(nn.Linear(2, 2))
    folder = accelerator.save_state(str(tmp_path / "ckpt"))
    with torch.no_grad():
        model.weight.zero_()
    with pytest.raises(TypeError, match="load_kwargs"):
        accelerator.load_state(folder, load_kwargs="weights_only")  # reached the loader's own check
    accelerator.load_state(folder, load_kwargs={"weights_only": True})
    assert model.weight.abs().sum() > 0


# --------------------------------------------------------------------------------------- state views
def test_accelerator_state_members(fresh_state: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerando.state import AcceleratorState, ThreadLocalSharedDict, do_nothing, is_initialized

    assert not is_initialized()
    accelerator = Accelerator(cpu=True)
    state = AcceleratorState()
    assert (
        is_initialized() and state.is_main_process and state.is_local_main_process and state.is_last_process
    )
    assert state.use_distributed is False and state.is_fsdp2 is False
    for name in (
        "is_main_process",
        "use_distributed",
        "print",
        "wait_for_everyone",
        "split_between_processes",
    ):
        assert name in vars(AcceleratorState), name  # its own member, not a fallback lookup
    with state.split_between_processes([1, 2]) as part, state.main_process_first():
        assert part == [1, 2]
    state.wait_for_everyone()
    monkeypatch.setenv("FORK_LAUNCHED", "1")
    assert state.fork_launched is True
    with pytest.raises(ValueError, match="DeepSpeed is not enabled"):
        state.get_deepspeed_plugin("default")
    PartialState().set_device()
    assert do_nothing(1, a=2) is None
    AcceleratorState(mixed_precision="no", cpu=True, _from_accelerator=True)  # what is in effect: accepted
    with pytest.raises(TypeError, match="cannot set mixed_precision"):
        AcceleratorState(mixed_precision="fp16")
    assert accelerator.state is not None

    class Holder:
        shared = ThreadLocalSharedDict()

    Holder.shared["main"] = 1
    seen: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: seen.update(dict(Holder.shared)))
    worker.start()
    worker.join()
    assert Holder.shared == {"main": 1} and seen == {}  # each thread has its own dict


def test_gradient_state_properties(fresh_state: Any) -> None:
    from accelerando.plugins.accumulation import GradientAccumulationPlugin
    from accelerando.state import GradientState

    state = GradientState(GradientAccumulationPlugin(num_steps=3, adjust_scheduler=False))
    assert (state.num_steps, state.adjust_scheduler, state.sync_with_dataloader) == (3, False, True)
    assert state.active_dataloader is None and state.dataloader_references == [None]
    assert state.is_xla_gradients_synced is False
    state.is_xla_gradients_synced = True
    assert GradientState().is_xla_gradients_synced is True
    with pytest.raises(AttributeError):
        state.adjust_scheduler = True  # type: ignore[misc]
    with pytest.raises(ValueError, match=">= 1"):
        state.num_steps = 0
    loader = object()
    state._add_dataloader(loader)
    assert state.active_dataloader is loader and state.dataloader_references == [None, loader]
    state._remove_dataloader(loader)
    assert state.active_dataloader is None


def test_multi_neuron_type() -> None:
    from accelerando.backends.connector import is_multi_device

    assert DistributedType("MULTI_NEURON") is DistributedType.MULTI_NEURON
    assert is_multi_device(DistributedType.MULTI_NEURON)


# ------------------------------------------------------------------------------------------ plugins
def test_deepspeed_plugin_config_process_and_keys() -> None:
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "eps": 1e-8}},
        "zero_optimization": {"stage": 2},
    }
    plugin = DeepSpeedPlugin(hf_ds_config=config)
    assert plugin.is_auto(ds_key_long="optimizer.params.lr") and not plugin.is_auto("missing.key")
    assert plugin.get_value(ds_key_long="zero_optimization.stage") == 2
    assert plugin.get_value("optimizer.params.beta", default=0.9) == 0.9
    with pytest.raises(ValueError, match="optimizer.params.eps=1e-08"):
        plugin.deepspeed_config_process(
            **{"train_micro_batch_size_per_gpu": 4, "optimizer.params.lr": 1e-3, "optimizer.params.eps": 1e-6}
        )
    plugin = DeepSpeedPlugin(hf_ds_config=config)
    plugin.deepspeed_config_process(
        must_match=False, **{"train_micro_batch_size_per_gpu": 4, "optimizer.params.lr": 1e-3}
    )
    assert (
        plugin.get_value("optimizer.params.lr") == 1e-3
        and plugin.get_value("train_micro_batch_size_per_gpu") == 4
    )
    mismatches: list[str] = []
    plugin.fill_match("zero_optimization.stage", mismatches, **{"zero_optimization.stage": 3})
    assert len(mismatches) == 1 and "zero_optimization.stage" in mismatches[0]
    with pytest.raises(ValueError, match="nothing gives its value"):
        DeepSpeedPlugin(hf_ds_config={"gradient_clipping": "auto"}).fill_match("gradient_clipping")
    assert (plugin.enable_msamp, plugin.msamp_opt_level) == (False, "O1")


def test_deepspeed_set_moe_leaf_modules() -> None:
    class Expert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(2, 2)

    model = nn.Sequential(Expert(), nn.Linear(2, 2))
    DeepSpeedPlugin(zero_stage=3).set_moe_leaf_modules(model)  # no names: nothing to do
    plugin = DeepSpeedPlugin(zero_stage=3, transformer_moe_cls_names="Missing")
    with pytest.raises(ValueError, match="Expert"):
        plugin.set_moe_leaf_modules(model)
    pytest.importorskip("deepspeed")
    from deepspeed.utils import z3_leaf_module

    DeepSpeedPlugin(zero_stage=3, transformer_moe_cls_names="Expert").set_moe_leaf_modules(model)
    assert z3_leaf_module(model[0]) and not z3_leaf_module(model[1])


def test_fsdp_plugin_offload_and_precision_checks() -> None:
    from torch.distributed.fsdp import (
        CPUOffload,
        CPUOffloadPolicy,
        MixedPrecision,
        MixedPrecisionPolicy,
        OffloadPolicy,
    )

    plugin = FullyShardedDataParallelPlugin(cpu_offload=True)
    plugin.set_cpu_offload()
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    plugin.set_cpu_offload()
    assert type(plugin.cpu_offload) is OffloadPolicy
    fsdp1 = FullyShardedDataParallelPlugin(fsdp_version=1, cpu_offload=True)
    fsdp1.set_cpu_offload()
    assert fsdp1.cpu_offload == CPUOffload(offload_params=True)
    # FSDP1 objects under the FSDP2 default are read as plain values.
    adopted = FullyShardedDataParallelPlugin(
        cpu_offload=CPUOffload(offload_params=True),
        mixed_precision_policy=MixedPrecision(param_dtype=torch.bfloat16),
    )
    assert adopted.cpu_offload is True and adopted.mixed_precision_policy == {"param_dtype": torch.bfloat16}
    with pytest.raises(ValueError, match="for FSDP2"):
        FullyShardedDataParallelPlugin(fsdp_version=1, cpu_offload=CPUOffloadPolicy())
    with pytest.raises(ValueError, match="for FSDP2"):
        FullyShardedDataParallelPlugin(fsdp_version=1, mixed_precision_policy=MixedPrecisionPolicy())
    with pytest.raises(TypeError, match="not supported"):
        FullyShardedDataParallelPlugin(mixed_precision_policy=3)
    with pytest.raises(ValueError, match="not supported"):
        FullyShardedDataParallelPlugin(cpu_offload=object())
    checked = FullyShardedDataParallelPlugin(mixed_precision_policy="bf16")
    checked.validate_mixed_precision_policy()
    checked.validate_cpu_offload()
    assert checked.activation_checkpointing_offload is False
    assert FullyShardedDataParallelPlugin(
        activation_checkpointing_offload=True
    ).activation_checkpointing_offload
    both = FullyShardedDataParallelPlugin(
        activation_checkpointing=True, activation_checkpointing_offload=True
    )
    assert both.activation_checkpointing and both.activation_checkpointing_offload  # recompute, inputs on CPU


def test_ddp_kwargs_to_dict_ignore_keys() -> None:
    handler = DistributedDataParallelKwargs(bucket_cap_mb=10, comm_hook="fp16")
    plain = handler.to_dict()
    assert plain["bucket_cap_mb"] == 10 and "comm_hook" not in plain and "comm_state_option" not in plain
    full = handler.to_dict(ignore_keys=())
    assert full["comm_hook"] == "fp16" and "comm_wrapper" in full
    assert handler.to_kwargs() == {"bucket_cap_mb": 10}


# ---------------------------------------------------------------------------------------- optimizer
def test_move_to_device_and_patch_optimizer_step() -> None:
    from accelerando.optimizer import AcceleratedOptimizer, move_to_device, patch_optimizer_step

    Pair = namedtuple("Pair", "a b")
    state = {
        "x": torch.ones(1, dtype=torch.float64),
        "nested": [Pair(torch.zeros(1), 3), (torch.ones(2),)],
        "n": 1,
    }
    moved = move_to_device(state, "meta")
    assert moved["x"].device.type == "meta" and moved["n"] == 1
    assert isinstance(moved["nested"][0], Pair) and moved["nested"][0].a.is_meta and moved["nested"][0].b == 3
    assert isinstance(moved["nested"][1], tuple) and moved["nested"][1][0].is_meta
    model = nn.Linear(2, 1)
    optimizer = AcceleratedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    optimizer._accelerate_step_called = False
    step = patch_optimizer_step(optimizer, optimizer.optimizer.step)
    model(torch.ones(1, 2)).sum().backward()
    step()
    assert optimizer._accelerate_step_called is True
    optimizer.zero_grad()  # set_to_none=None: torch's default
    assert model.weight.grad is None


# ------------------------------------------------------------------------------- two processes (gloo)
def _mesh_ranks_per_rank() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, config in (
        ("shard", ParallelismConfig(dp_shard_size=2)),
        ("replicate", ParallelismConfig(dp_replicate_size=2)),
        ("plain", ParallelismConfig()),
    ):
        accelerator = Accelerator(cpu=True, parallelism_config=config)
        mesh = accelerator.torch_device_mesh
        out[name] = {
            "shard_rank": accelerator.data_parallel_shard_rank,
            "dp_rank": accelerator.data_parallel_rank,
            "save": accelerator.should_save_model,
            "dims": list(mesh.mesh_dim_names) if mesh is not None else None,
            "dp_size": config.data_parallel_size,
            "same_mesh": config.get_device_mesh() is mesh,
        }
    PartialState().wait_for_everyone()
    return out


def test_mesh_ranks_in_two_processes() -> None:
    results = run_distributed_preloaded(_mesh_ranks_per_rank, 2, env={"OMP_NUM_THREADS": "1"})
    for rank, got in enumerate(results):
        assert got["shard"] == {
            "shard_rank": rank,
            "dp_rank": rank,
            "save": True,
            "dims": ["dp_shard"],
            "dp_size": 2,
            "same_mesh": True,
        }
        assert got["replicate"]["shard_rank"] == 0 and got["replicate"]["dp_rank"] == rank
        assert got["replicate"]["save"] is (rank == 0)  # a replica writes nothing another rank writes
        assert got["plain"]["dims"] == ["dp_replicate"] and got["plain"]["dp_size"] == 2
