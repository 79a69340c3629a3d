"""FSDP without processes: the plugin and its settings, wrap units, the automatic sharding choice,
merging sharded checkpoints, the merge-weights command and the clear errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from accelerando.backends.strategies.fsdp.auto import (
    ShardingChoice,
    choose_sharding_strategy,
    estimate_sharding_memory,
)
from accelerando.backends.strategies.fsdp.checkpoint import (
    disable_fsdp_ram_efficient_loading,
    enable_fsdp_ram_efficient_loading,
)
from accelerando.backends.strategies.fsdp.helpers import merge_fsdp_weights
from accelerando.plugins.fsdp import FullyShardedDataParallelPlugin as Plugin

MB = 10**6


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in list(os.environ):
        if "FSDP" in name:
            monkeypatch.delenv(name)


# ------------------------------------------------------------------------------------ the plugin
def test_plugin_defaults():
    p = Plugin()
    assert p.fsdp_version == 2
    assert p.state_dict_type == "FULL_STATE_DICT"
    assert p.resolved_sharding() == "FULL_SHARD"
    assert p.use_orig_params is True and p.cpu_offload is False and p.sync_module_states is False
    assert p.auto_wrap_policy == "TRANSFORMER_BASED_WRAP"
    assert p.mixed_precision_dtypes() is None
    assert p.sources["fsdp_version"] == "default"


def test_plugin_fills_unset_fields_from_environment_and_code_wins(monkeypatch):
    monkeypatch.setenv("FSDP_SHARDING_STRATEGY", "2")  # the config wizard's numbered answer
    monkeypatch.setenv("FSDP_VERSION", "1")
    monkeypatch.setenv("FSDP_TRANSFORMER_CLS_TO_WRAP", "BertLayer, BertEmbeddings")
    monkeypatch.setenv("ACCELERANDO_FSDP_STATE_DICT_TYPE", "SHARDED_STATE_DICT")
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "true")
    p = Plugin()
    assert p.fsdp_version == 1
    assert p.sharding_strategy == "SHARD_GRAD_OP"
    assert p.transformer_cls_names_to_wrap == ["BertLayer", "BertEmbeddings"]
    assert p.state_dict_type == "SHARDED_STATE_DICT"
    assert p.sources["state_dict_type"] == "env:ACCELERANDO_FSDP_STATE_DICT_TYPE"
    assert p.cpu_ram_efficient_loading and p.sync_module_states  # implied
    coded = Plugin(fsdp_version=2, sharding_strategy="FULL_SHARD", state_dict_type="FULL_STATE_DICT")
    assert (coded.fsdp_version, coded.sharding_strategy, coded.state_dict_type) == (
        2,
        "FULL_SHARD",
        "FULL_STATE_DICT",
    )
    assert coded.sources["sharding_strategy"] == "code"


def test_plugin_accepts_fsdp1_enums_and_reshard_after_forward():
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy, StateDictType

    p = Plugin(
        sharding_strategy=ShardingStrategy.HYBRID_SHARD,
        backward_prefetch=BackwardPrefetch.BACKWARD_POST,
        state_dict_type=StateDictType.SHARDED_STATE_DICT,
    )
    assert (p.sharding_strategy, p.backward_prefetch, p.state_dict_type) == (
        "HYBRID_SHARD",
        "BACKWARD_POST",
        "SHARDED_STATE_DICT",
    )
    assert p.resolved_sharding() == "HYBRID_SHARD"
    assert Plugin(reshard_after_forward=False).resolved_sharding() == "SHARD_GRAD_OP"
    assert Plugin(reshard_after_forward="false").resolved_sharding() == "SHARD_GRAD_OP"
    assert Plugin(reshard_after_forward="NO_SHARD").resolved_sharding() == "NO_SHARD"
    assert Plugin(sharding_strategy="HYBRID_SHARD", reshard_after_forward=False).resolved_sharding() == (
        "HYBRID_SHARD_ZERO2"
    )
    assert Plugin(sharding_strategy="auto").is_auto_sharding


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"sharding_strategy": "FULLSHARD"}, "sharding_strategy"),
        ({"fsdp_version": 3}, "fsdp_version"),
        ({"state_dict_type": "WHOLE"}, "state_dict_type"),
        ({"auto_wrap_policy": "LAYERS"}, "auto_wrap_policy"),
        ({"activation_checkpointing": "maybe"}, "activation_checkpointing"),
        ({"min_num_params": -1}, "min_num_params"),
    ],
)
def test_plugin_rejects_bad_values(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        Plugin(**kwargs)


def test_mixed_precision_policy_forms():
    assert Plugin(mixed_precision_policy="bf16").mixed_precision_dtypes() == {
        "param_dtype": torch.bfloat16,
        "reduce_dtype": torch.float32,
    }
    as_dict = Plugin(
        mixed_precision_policy={"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": None}
    )
    assert as_dict.mixed_precision_dtypes() == {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32}
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    two = Plugin(mixed_precision_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    assert two.mixed_precision_dtypes() == {"param_dtype": torch.bfloat16}
    one = Plugin(mixed_precision_policy=MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16))
    assert one.mixed_precision_dtypes() == {"param_dtype": torch.float16, "reduce_dtype": torch.float16}
    p = Plugin()
    p.set_mixed_precision("bf16")
    assert p.mixed_precision_dtypes()["param_dtype"] == torch.bfloat16
    p.set_mixed_precision("fp16")  # not overridden without override=True
    assert p.mixed_precision_dtypes()["param_dtype"] == torch.bfloat16
    with pytest.raises(TypeError, match="mixed_precision_policy"):
        Plugin(mixed_precision_policy=3.5).mixed_precision_dtypes()


# -------------------------------------------------------------------------------- wrap units
class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x)


class Net(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 2)


def test_transformer_wrap_uses_names_or_no_split_modules():
    from accelerando.backends.strategies.fsdp.wrap import wrap_units

    net = Net()
    assert wrap_units(Plugin(), net) == list(net.blocks)  # from _no_split_modules
    assert wrap_units(Plugin(transformer_cls_names_to_wrap="Linear"), net) == [
        net.embed,
        net.blocks[0].fc,
        net.blocks[1].fc,
        net.head,
    ]
    assert wrap_units(Plugin(auto_wrap_policy="NO_WRAP"), net) == []


def test_unknown_layer_class_is_a_clear_error():
    from accelerando.backends.strategies.fsdp.wrap import wrap_units

    with pytest.raises(ValueError, match=r"LlamaDecoderLayer.*match no submodule.*Block"):
        wrap_units(Plugin(transformer_cls_names_to_wrap=["LlamaDecoderLayer"]), Net())


def test_size_based_wrap_is_bottom_up():
    from accelerando.backends.strategies.fsdp.wrap import wrap_units

    net = Net()  # embed 40, each block 72, head 18 parameters
    units = wrap_units(Plugin(auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=70), net)
    assert units == [net.blocks[0].fc, net.blocks[1].fc]
    assert Plugin(min_num_params=70).auto_wrap_policy == "SIZE_BASED_WRAP"  # a size asks for it


# ------------------------------------------------------------------------ automatic choice
P1M = 1_000_000  # 16 MB of fp32 master + grad + Adam state


@pytest.mark.parametrize(
    ("num_params", "memory", "compute_bytes", "unit", "expected", "offload"),
    [
        (P1M, 100 * MB, 4, 100_000, "NO_SHARD", False),  # 16 MB fits in 80 MB
        (P1M, 16 * MB, 4, 100_000, "SHARD_GRAD_OP", False),  # NO_SHARD 16 > 12.8; SGO 8 + 4 = 12
        (P1M, 12 * MB, 4, 100_000, "FULL_SHARD", False),  # SGO 12 > 9.6; FULL 8 + 0.8
        (P1M, 4 * MB, 4, 100_000, "FULL_SHARD", True),  # FULL 8.8 > 3.2; offloaded: 0.8
        (P1M, 22 * MB, 2, 100_000, "NO_SHARD", False),  # bf16 compute copy: 16 + 2 = 18 <= 17.6? no
        (P1M, 23 * MB, 2, 100_000, "NO_SHARD", False),  # 18 <= 18.4
        (10 * P1M, 120 * MB, 4, 1_000_000, "FULL_SHARD", False),  # 160 MB model: SGO 120 > 96; FULL 80 + 8
    ],
)
def test_auto_choice_table(num_params, memory, compute_bytes, unit, expected, offload):
    if memory == 22 * MB:
        expected = "SHARD_GRAD_OP"  # 18 MB > 17.6 MB usable: one step more sharding (8 + 2 = 10)
    choice = choose_sharding_strategy(
        num_params, 2, memory, compute_bytes=compute_bytes, largest_unit_params=unit, headroom=0.2
    )
    assert isinstance(choice, ShardingChoice)
    assert (choice.strategy, choice.cpu_offload) == (expected, offload)
    assert choice.bytes_per_process <= choice.budget_bytes == int(memory * 0.8)
    label = expected + (" + CPU offload" if offload else "")
    assert f"{label}: needs" in choice.reason and choice.reason.endswith("chosen")
    # Every cheaper candidate is named with the reason it was skipped.
    order = ["NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD"]
    for skipped in order[: order.index(expected)]:
        assert f"{skipped}: needs" in choice.reason and "usable" in choice.reason


def test_auto_choice_more_processes_need_less_sharding_memory():
    four = choose_sharding_strategy(P1M, 4, 12 * MB, largest_unit_params=100_000)
    assert four.strategy == "SHARD_GRAD_OP"  # 4 + 4 = 8 MB <= 9.6 MB with four processes


def test_auto_choice_nothing_fits_is_a_clear_error():
    with pytest.raises(ValueError, match=r"does not fit.*more processes"):
        choose_sharding_strategy(P1M, 2, MB // 2, largest_unit_params=100_000)
    with pytest.raises(ValueError, match="CPU memory"):
        choose_sharding_strategy(P1M, 2, 4 * MB, largest_unit_params=100_000, cpu_memory_bytes=MB)


def test_estimates_follow_the_memory_model():
    assert estimate_sharding_memory(P1M, 2, "NO_SHARD") == 16 * MB
    assert estimate_sharding_memory(P1M, 2, "SHARD_GRAD_OP") == 12 * MB
    assert estimate_sharding_memory(P1M, 2, "FULL_SHARD", largest_unit_params=0) == 8 * MB
    assert estimate_sharding_memory(P1M, 2, "FULL_SHARD", cpu_offload=True, largest_unit_params=10) == 80
    with pytest.raises(ValueError, match="strategy"):
        estimate_sharding_memory(P1M, 2, "HALF_SHARD")


# ------------------------------------------------------------------ merging and the command
def _write_dcp(folder: str, state: dict[str, torch.Tensor]) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": state}, storage_writer=dcp.FileSystemWriter(folder), no_dist=True)


def test_merge_fsdp_weights_single_and_sharded(tmp_path):
    from safetensors.torch import load_file

    torch.manual_seed(0)
    state = {"a.weight": torch.randn(64, 64), "b.bias": torch.randn(64), "c": torch.arange(5)}
    shards = str(tmp_path / "pytorch_model_fsdp_0")
    _write_dcp(shards, state)
    out = merge_fsdp_weights(shards, str(tmp_path / "merged"))
    merged = load_file(os.path.join(out, "model.safetensors"))
    assert set(merged) == set(state) and all(torch.equal(merged[k], state[k]) for k in state)
    # Above max_shard_size: several files and an index.
    split = merge_fsdp_weights(shards, str(tmp_path / "split"), max_shard_size=10_000)
    names = sorted(os.listdir(split))
    assert "model.safetensors.index.json" in names and len(names) > 2
    unsafe = merge_fsdp_weights(
        shards, str(tmp_path / "bin"), safe_serialization=False, remove_checkpoint_dir=True
    )
    loaded = torch.load(os.path.join(unsafe, "pytorch_model.bin"), weights_only=True)
    assert torch.equal(loaded["a.weight"], state["a.weight"])
    assert not os.path.exists(shards)


def test_merge_weights_command(tmp_path, capsys):
    from accelerando.commands.cli import main

    shards = str(tmp_path / "pytorch_model_fsdp_0")
    _write_dcp(shards, {"w": torch.ones(3)})
    assert main(["merge-weights", shards, str(tmp_path / "out"), "--unsafe_serialization"]) == 0
    assert os.path.exists(tmp_path / "out" / "pytorch_model.bin")
    assert main(["merge-weights", str(tmp_path / "nothing"), str(tmp_path / "o2")]) == 1
    assert "not a sharded checkpoint" in capsys.readouterr().err


def test_merge_command_module_does_not_import_torch():
    code = "import sys, accelerando.commands.merge as m; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------- switches and errors
def test_ram_efficient_loading_switches(monkeypatch):
    from accelerando.backends.strategies.fsdp.checkpoint import _RAM_EFFICIENT_VARS

    # setenv (not delenv of an absent name) registers a restore, so nothing leaks to later tests.
    for name in (*_RAM_EFFICIENT_VARS, "ACCELERATE_USE_FSDP", "ACCELERANDO_USE_FSDP"):
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    enable_fsdp_ram_efficient_loading()
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true"
    assert os.environ["ACCELERATE_USE_FSDP"] == "true"
    assert Plugin().cpu_ram_efficient_loading
    disable_fsdp_ram_efficient_loading()
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "false"
    assert not Plugin().cpu_ram_efficient_loading
