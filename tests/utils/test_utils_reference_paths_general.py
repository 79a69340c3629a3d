"""Behaviour of the reference-path utility modules: constants, availability checks, environment helpers,
regional compilation, memory, tqdm, versions, torch_xla, dataclasses and the parallelism configs."""

from __future__ import annotations

import importlib.metadata
import socket
import subprocess
import sys

import pytest
import torch

from accelerando.common import constants, environment, imports
from accelerando.utils import other  # the reference's path: re-exports from the owners

# --- constants ------------------------------------------------------------------------------------


def test_constants_have_the_reference_values():
    assert constants.MODEL_NAME == "pytorch_model"
    assert constants.WEIGHTS_NAME == "pytorch_model.bin"
    assert constants.WEIGHTS_INDEX_NAME == "pytorch_model.bin.index.json"
    assert constants.SAFE_WEIGHTS_NAME == "model.safetensors"
    assert constants.SAFE_WEIGHTS_INDEX_NAME == "model.safetensors.index.json"
    assert (
        constants.SAFE_WEIGHTS_PATTERN_NAME.format(suffix="-00001-of-00002")
        == "model-00001-of-00002.safetensors"
    )
    assert constants.WEIGHTS_PATTERN_NAME.format(suffix="_1") == "pytorch_model_1.bin"
    assert constants.PROFILE_PATTERN_NAME.format(suffix="0") == "profile_0.json"
    assert (constants.OPTIMIZER_NAME, constants.SCHEDULER_NAME, constants.SAMPLER_NAME) == (
        "optimizer",
        "scheduler",
        "sampler",
    )
    assert (constants.SCALER_NAME, constants.RNG_STATE_NAME) == ("scaler.pt", "random_states")
    assert constants.FSDP_PYTORCH_VERSION == "2.1.0.a0+32f93b1"
    assert constants.CUDA_DISTRIBUTED_TYPES == ["DEEPSPEED", "MULTI_GPU", "FSDP", "MEGATRON_LM", "TP"]
    assert constants.TORCH_DISTRIBUTED_OPERATION_TYPES[:5] == constants.CUDA_DISTRIBUTED_TYPES
    assert "MULTI_CPU" in constants.TORCH_DISTRIBUTED_OPERATION_TYPES
    assert "XLA" not in constants.TORCH_DISTRIBUTED_OPERATION_TYPES


def test_distributed_type_members_are_found_in_the_lists():
    from accelerando.core.enums import DistributedType

    assert DistributedType.MULTI_GPU in constants.CUDA_DISTRIBUTED_TYPES
    assert DistributedType.MULTI_CPU not in constants.CUDA_DISTRIBUTED_TYPES
    assert DistributedType.MULTI_CPU in constants.TORCH_DISTRIBUTED_OPERATION_TYPES


def test_constants_match_the_surface_file_values():
    import ast
    from pathlib import Path

    surface = Path(__file__).resolve().parents[3] / "shared" / "parity" / "reference-surface.txt"
    if not surface.is_file():
        pytest.skip("shared parity file not present")
    block = surface.read_text().split("## accelerate.utils.constants\n")[1].split("\n## ")[0]
    for line in block.strip().splitlines():
        name, value = line.split(" = ", 1)
        assert getattr(constants, name) == ast.literal_eval(value), name


def test_other_modules_reexport_the_same_constants():
    from accelerando.common import random as rnd

    assert other.FSDP_PYTORCH_VERSION is constants.FSDP_PYTORCH_VERSION
    assert rnd.CUDA_DISTRIBUTED_TYPES is constants.CUDA_DISTRIBUTED_TYPES


# --- availability checks --------------------------------------------------------------------------


def test_installed_and_missing_libraries():
    assert imports.is_pytest_available() is True
    assert imports.is_numpy_available() is True
    assert imports.is_numpy_available(min_version="999.0") is False
    assert imports.is_torch_distributed_available() is True
    assert imports.is_pippy_available() is imports.is_torch_version(">=", "2.4.0")
    assert imports.is_weights_only_available() is imports.is_torch_version(">=", "2.4.0")
    assert imports.is_rocm_available() is (torch.version.hip is not None)
    # Libraries that are not installed here
    for check in (imports.is_lomo_available, imports.is_import_timer_available, imports.is_mlu_available):
        assert check() is False


def test_checks_follow_find_spec(monkeypatch):
    calls = []

    def fake_available(name, distribution=None):
        calls.append(name)
        return name == "timm"

    monkeypatch.setattr(imports, "is_package_available", fake_available)
    assert imports.is_timm_available() is True
    assert imports.is_peft_available() is False
    assert imports.is_sagemaker_available() is False
    assert calls == ["timm", "peft", "sagemaker"]


def test_checks_do_not_import_the_library():
    code = (
        "import sys, accelerando.utils.imports as i;"
        "i.is_pandas_available(); i.is_peft_available(); i.is_boto3_available(); i.is_torchdata_available();"
        "print(any(m in sys.modules for m in ('pandas', 'peft', 'boto3', 'torchdata')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_fp8_and_fp16(monkeypatch):
    monkeypatch.setattr(imports, "is_msamp_available", lambda: False)
    monkeypatch.setattr(imports, "is_transformer_engine_available", lambda: False)
    monkeypatch.setattr(imports, "is_torchao_available", lambda: True)
    assert imports.is_fp8_available() is True
    monkeypatch.setattr(imports, "is_torchao_available", lambda: False)
    assert imports.is_fp8_available() is False
    assert imports.is_fp16_available() is True  # no Gaudi here
    monkeypatch.setattr(imports, "is_habana_gaudi1", lambda: True)
    assert imports.is_fp16_available() is False


def test_use_torch_xla_switch(monkeypatch):
    import importlib

    monkeypatch.setenv("USE_TORCH_XLA", "0")
    reloaded = importlib.reload(imports)
    try:
        assert reloaded.USE_TORCH_XLA is False
        monkeypatch.setattr(reloaded, "is_package_available", lambda name, dist=None: True)
        assert reloaded.is_torch_xla_available() is False
    finally:
        monkeypatch.delenv("USE_TORCH_XLA")
        importlib.reload(imports)
    assert imports.USE_TORCH_XLA is True


def test_required_decorators(monkeypatch):
    @imports.deepspeed_required
    def needs_deepspeed(x):
        return x + 1

    @imports.torchao_required
    def needs_torchao():
        return "ran"

    monkeypatch.setattr(imports, "is_deepspeed_available", lambda: True)
    assert needs_deepspeed(1) == 2
    monkeypatch.setattr(imports, "is_deepspeed_available", lambda: False)
    with pytest.raises(ImportError, match="pip install deepspeed"):
        needs_deepspeed(1)
    monkeypatch.setattr(imports, "is_torchao_available", lambda: False)
    with pytest.raises(ImportError, match="torchao"):
        needs_torchao()
    assert needs_deepspeed.__name__ == "needs_deepspeed"


def test_versions_module():
    from accelerando.utils import versions

    assert versions.is_torch_version(">=", "1.0")
    assert versions.compare_versions("packaging", ">=", "0.1")
    assert versions.compare_versions("surely-not-installed-pkg", ">=", "0.1") is False


# --- environment ----------------------------------------------------------------------------------


def test_cpu_distributed_information(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    assert environment.get_cpu_distributed_information() == environment.CPUInformation(0, 1, 0, 1)
    monkeypatch.setenv("PMI_RANK", "3")
    monkeypatch.setenv("PMI_SIZE", "4")
    monkeypatch.setenv("MPI_LOCALRANKID", "1")
    monkeypatch.setenv("MPI_LOCALNRANKS", "2")
    info = environment.get_cpu_distributed_information()
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (3, 4, 1, 2)
    monkeypatch.setenv("RANK", "0")  # torchrun's names win
    assert environment.get_cpu_distributed_information().rank == 0
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        environment.get_cpu_distributed_information()


def test_env_file_lines_leave_out_unsafe_entries(caplog):
    lines = environment.convert_dict_to_env_variables(
        {"A": "1", "B": "x y", "C": "a;rm -rf", "D": "", "E": "/p/q:/r"}
    )
    assert lines == ["A=1\n", "E=/p/q:/r\n"]
    assert "B" in caplog.text and "C" in caplog.text


def test_parse_choice_and_flag(monkeypatch):
    monkeypatch.delenv("H1_CHOICE", raising=False)
    assert environment.parse_choice_from_env("H1_CHOICE") == "no"
    assert environment.parse_choice_from_env("H1_CHOICE", default=3) == "3"
    monkeypatch.setenv("H1_CHOICE", "fp16")
    assert environment.parse_choice_from_env("H1_CHOICE") == "fp16"
    monkeypatch.setenv("H1_FLAG", "YES")
    assert environment.parse_flag_from_env("H1_FLAG") is True
    assert environment.str_to_bool("off") == 0 and environment.str_to_bool("on", to_bool=True) is True


def test_libraries_initialized():
    assert environment.are_libraries_initialized("torch", "surely_not_a_module") == ["torch"]


def test_device_type_and_visibility(monkeypatch):
    monkeypatch.setattr(imports, "is_xpu_available", lambda check_device=False: False)
    assert environment.get_current_device_type() == ("cuda", "CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(imports, "is_xpu_available", lambda check_device=False: True)
    assert environment.get_current_device_type() == ("xpu", "ZE_AFFINITY_MASK")
    monkeypatch.setattr(imports, "is_npu_available", lambda check_device=False: True)
    assert environment.get_current_device_type() == ("npu", "ASCEND_RT_VISIBLE_DEVICES")


def _fake_smi(outputs):
    def run(query):
        return outputs[query]

    return run


def test_gpu_info_and_p2p(monkeypatch):
    monkeypatch.setattr(environment, "_nvidia_smi", _fake_smi({"name": ["NVIDIA H100"] * 2}))
    assert environment.get_gpu_info() == (["NVIDIA H100", "NVIDIA H100"], 2)
    assert environment.check_cuda_p2p_ib_support() is True
    rtx = {"name": ["NVIDIA GeForce RTX 4090"] * 2, "driver_version": ["535.1.0"]}
    monkeypatch.setattr(environment, "_nvidia_smi", _fake_smi(rtx))
    assert environment.get_driver_version() == "535.1.0"
    assert environment.check_cuda_p2p_ib_support() is False
    rtx["driver_version"] = ["550.54.15"]
    assert environment.check_cuda_p2p_ib_support() is True
    rtx["name"] = ["NVIDIA GeForce RTX 4090"]  # one GPU: nothing to transfer between
    rtx["driver_version"] = ["535.1.0"]
    assert environment.check_cuda_p2p_ib_support() is True


def test_gpu_queries_without_nvidia_smi(monkeypatch):
    monkeypatch.setattr(environment.shutil, "which", lambda name: None)
    monkeypatch.setattr(environment.sys, "platform", "linux")
    with pytest.raises(RuntimeError, match="nvidia-smi"):
        environment.get_gpu_info()
    assert environment.check_cuda_p2p_ib_support() is True


def test_fp8_capability_without_cuda(monkeypatch):
    monkeypatch.setattr(imports, "is_cuda_available", lambda: False)
    assert environment.check_cuda_fp8_capability() is False


def test_override_numa_affinity_needs_pynvml(monkeypatch):
    monkeypatch.setattr(imports, "is_pynvml_available", lambda: False)
    with pytest.raises(ImportError, match="pynvml"):
        environment.override_numa_affinity(0)


def test_check_os_kernel(monkeypatch, caplog):
    import platform

    def uname(release, system="Linux"):
        return platform.uname_result(system, "host", release, "", "x86_64")

    monkeypatch.setattr(platform, "uname", lambda: uname("4.15.0-generic"))
    other.check_os_kernel()
    assert "4.15.0" in caplog.text and "5.5.0" in caplog.text
    caplog.clear()
    monkeypatch.setattr(platform, "uname", lambda: uname("6.8.0-45-generic"))
    other.check_os_kernel()
    monkeypatch.setattr(platform, "uname", lambda: uname("23.1.0", system="Darwin"))
    other.check_os_kernel()
    assert caplog.text == ""


# --- other ----------------------------------------------------------------------------------------


def test_ports():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert other.is_port_in_use(port) is True
    free = other.get_free_port()
    assert isinstance(free, int) and other.is_port_in_use(free) is False


def test_recursive_getattr():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3))
    assert other.recursive_getattr(model, "0.weight").shape == (3, 2)
    with pytest.raises(AttributeError):
        other.recursive_getattr(model, "0.nope")


def test_torch_safe_globals_allow_loading_numpy_rng_state(tmp_path):
    import numpy as np

    path = tmp_path / "rng.pt"
    torch.save({"numpy": np.random.get_state()}, path)
    with torch.serialization.safe_globals(other.TORCH_SAFE_GLOBALS):
        state = torch.load(path, weights_only=True)
    assert state["numpy"][0] == "MT19937"


def test_reexports_are_the_project_functions():
    from accelerando.common import operations, serialization

    assert other.save is serialization.save and other.load is serialization.load
    assert other.clean_state_dict_for_safetensors is serialization.clean_state_dict_for_safetensors
    assert other.wait_for_everyone is operations.wait_for_everyone


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.linear(x))


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(4, 4)
        self.layers = torch.nn.ModuleList([_Block() for _ in range(3)])

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return x


def test_repeated_blocks():
    net = _Net()
    assert other.is_repeated_blocks(net.layers) and not other.is_repeated_blocks(net)
    assert not other.is_repeated_blocks(torch.nn.ModuleList([_Block(), torch.nn.Linear(1, 1)]))
    assert not other.is_repeated_blocks(torch.nn.ModuleList())
    assert other.has_repeated_blocks(net) and not other.has_repeated_blocks(torch.nn.Linear(1, 1))


def test_compile_regions_compiles_each_block_and_keeps_the_original():
    net = _Net()
    compiled = other.compile_regions(net, backend="eager")
    assert compiled is not net
    assert all(other.is_compiled_module(block) for block in compiled.layers)
    assert other.is_compiled_module(compiled.embed)  # other children are compiled whole
    assert compiled.embed._orig_mod is net.embed and net.layers[0] is compiled.layers[0]._orig_mod
    assert other.has_compiled_regions(compiled) and not other.has_compiled_regions(net)
    assert compiled.embed.weight is net.embed.weight  # parameters shared
    assert not any(other.is_compiled_module(m) for m in net.modules())  # the original is untouched
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), net(x))
    assert other.extract_model_from_parallel(compiled, keep_torch_compile=False) is net
    assert other.extract_model_from_parallel(compiled) is compiled


def test_compile_regions_without_blocks_compiles_the_whole_model():
    linear = torch.nn.Linear(2, 2)
    compiled = other.compile_regions(linear, backend="eager")
    assert other.is_compiled_module(compiled)
    assert other.extract_model_from_parallel(compiled, keep_torch_compile=False) is linear
    with pytest.raises(TypeError):
        other.compile_regions("not a module")


def test_in_place_variants_keep_the_module_objects():
    net = _Net()
    blocks = list(net.layers)
    assert other.compile_regions_fsdp2(net, backend="eager") is net
    assert list(net.layers) == blocks
    assert all(block._compiled_call_impl is not None for block in net.layers)
    assert net.embed._compiled_call_impl is not None  # other children are compiled whole
    assert net._compiled_call_impl is None  # the model itself is not
    plain = torch.nn.Linear(2, 2)
    other.compile_regions_deepspeed(plain, backend="eager")
    assert plain._compiled_call_impl is not None


def test_dtensor_helpers_on_plain_models():
    model = torch.nn.Linear(2, 2)
    assert other.model_has_dtensor(model) is False
    assert other.get_model_tp_size(model) is None
    model.tp_size = 4
    assert other.get_model_tp_size(model) == 4


def test_get_module_children_bottom_up():
    from accelerando.utils.other import get_module_children_bottom_up

    net = _Net()
    modules = get_module_children_bottom_up(net)
    assert modules[-1] is net and modules[0] is not net


# --- memory, tqdm, torch_xla ---------------------------------------------------------------------


def test_clear_device_cache_collects_garbage(monkeypatch):
    from accelerando.common import memory

    collected = []
    monkeypatch.setattr(memory.gc, "collect", lambda: collected.append(1))
    memory.clear_device_cache()
    assert collected == []
    memory.clear_device_cache(garbage_collection=True)
    assert collected == [1]


def test_tqdm_module_and_function_are_both_callable():
    import accelerando.utils.tqdm as tqdm_module

    bar = tqdm_module(range(3), main_process_only=False, disable=True)
    assert list(bar) == [0, 1, 2]
    assert list(tqdm_module.tqdm(range(2), disable=True)) == [0, 1]


def test_install_xla(monkeypatch):
    from accelerando.common import torch_xla

    for key in [k for k in __import__("os").environ if k.startswith(("COLAB_", "KAGGLE_"))]:
        monkeypatch.delenv(key)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    with pytest.raises(RuntimeError, match="Colab"):
        torch_xla.install_xla()
    commands = []
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    monkeypatch.setattr(
        torch_xla.subprocess,
        "run",
        lambda cmd, check: commands.append(cmd) or subprocess.CompletedProcess(cmd, 0),
    )
    torch_xla.install_xla()
    version = importlib.metadata.version("torch").split("+")[0]
    assert commands == [[sys.executable, "-m", "pip", "install", f"torch_xla[tpu]=={version}"]]
    commands.clear()
    torch_xla.install_xla(upgrade=True)
    assert [c[-1] for c in commands] == ["torch", "torch_xla[tpu]"]
    monkeypatch.setattr(torch_xla.subprocess, "run", lambda cmd, check: subprocess.CompletedProcess(cmd, 1))
    with pytest.raises(RuntimeError, match="exited with 1"):
        torch_xla.install_xla()


# --- dataclasses and parallel configs --------------------------------------------------------------


def test_dataclasses_reexports_the_project_classes():
    from accelerando.common.operations import TensorInformation
    from accelerando.plugins.deepspeed import DeepSpeedPlugin
    from accelerando.plugins.kwargs import DistributedDataParallelKwargs
    from accelerando.utils import dataclasses as dc

    assert dc.DeepSpeedPlugin is DeepSpeedPlugin
    assert dc.DistributedDataParallelKwargs is DistributedDataParallelKwargs
    assert dc.TensorInformation is TensorInformation
    assert dc.TYPE_CHECKING is False
    assert dc.FSDP_SHARDING_STRATEGY is constants.FSDP_SHARDING_STRATEGY
    for name in dc.__all__:
        assert getattr(dc, name) is not None or name == "TYPE_CHECKING"
    with pytest.raises(AttributeError):
        dc.NotAThing  # noqa: B018


def test_dataclasses_import_is_light():
    code = "import sys, accelerando.utils.dataclasses; print('accelerando.plugins.deepspeed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_base_enum_and_fp8_backend_type():
    from accelerando.utils.dataclasses import BaseEnum, EnumWithContains, FP8BackendType

    assert FP8BackendType.list() == ["NO", "TE", "MSAMP", "AO"]
    assert "TE" in FP8BackendType and "te" not in FP8BackendType and 3 not in FP8BackendType
    assert FP8BackendType.AO == "AO" and str(FP8BackendType.MSAMP) == "MSAMP"
    assert isinstance(FP8BackendType, EnumWithContains) and issubclass(FP8BackendType, BaseEnum)


def test_get_module_class_from_name():
    from accelerando.utils.dataclasses import get_module_class_from_name

    assert get_module_class_from_name(_Net(), "_Block") is _Block
    assert get_module_class_from_name(_Net(), "Linear") is torch.nn.Linear
    assert get_module_class_from_name(_Net(), "GPT2Block") is None


def test_parallel_configs(monkeypatch):
    from accelerando.utils.dataclasses import (
        DeepSpeedSequenceParallelConfig,
        TorchContextParallelConfig,
        TorchTensorParallelConfig,
    )

    for key in [k for k in __import__("os").environ if k.startswith("PARALLELISM_CONFIG_")]:
        monkeypatch.delenv(key)
    assert TorchTensorParallelConfig().enable_async_tp is False
    with pytest.raises(TypeError):
        TorchTensorParallelConfig(enable_async_tp="yes")
    assert TorchContextParallelConfig().cp_comm_strategy == "allgather"
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall")
    assert TorchContextParallelConfig().cp_comm_strategy == "alltoall"
    with pytest.raises(ValueError, match="allgather"):
        TorchContextParallelConfig(cp_comm_strategy="ring")
    sp = DeepSpeedSequenceParallelConfig()
    assert (sp.sp_seq_length, sp.sp_seq_length_is_variable, sp.sp_attn_implementation) == (None, True, None)
    with pytest.raises(ValueError, match="sp_seq_length"):
        DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=False)
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH", "512")
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", "false")
    fixed = DeepSpeedSequenceParallelConfig()
    assert (fixed.sp_seq_length, fixed.sp_seq_length_is_variable) == (512, False)
    with pytest.raises(ValueError, match="Invalid sp_attn_implementation: eager. Must be one of"):
        DeepSpeedSequenceParallelConfig(sp_attn_implementation="eager")
    hub = DeepSpeedSequenceParallelConfig(sp_attn_implementation="kernels-community/flash-attn2")
    assert hub.sp_attn_implementation == "kernels-community/flash-attn2"
    with pytest.raises(ValueError, match="Invalid cp_comm_strategy: ring. Must be one of"):
        TorchContextParallelConfig(cp_comm_strategy="ring")


def test_parallelism_config_uses_the_handlers():
    from accelerando.parallelism_config import ParallelismConfig
    from accelerando.plugins.parallel_configs import TorchContextParallelConfig

    handler = TorchContextParallelConfig(cp_comm_strategy="alltoall")
    config = ParallelismConfig(dp_shard_size=2, cp_size=2, cp_handler=handler)
    assert config.cp_handler is handler


def test_megatron_parsers():
    from types import SimpleNamespace

    from accelerando.plugins import megatron_parsers as mp

    plugin = SimpleNamespace(
        seq_length=None, encoder_seq_length=None, decoder_seq_length=None, return_logits=True
    )
    config = SimpleNamespace(
        model_type="gpt2", n_layer=2, n_embd=8, n_head=2, n_positions=64, vocab_size=100, return_dict=True
    )
    model = SimpleNamespace(config=config)
    mp.parse_model_config(plugin, model, {"input_ids": torch.zeros(2, 16)})
    args = plugin.megatron_lm_default_args
    assert (args["num_layers"], args["hidden_size"], args["seq_length"], args["orig_vocab_size"]) == (
        2,
        8,
        16,
        100,
    )
    assert args["tokenizer_type"] == "GPT2BPETokenizer" and args["return_logits"] is True
    config.model_type = "unknown"
    with pytest.raises(ValueError, match="No Megatron-LM parser"):
        mp.parse_model_config(plugin, model)

    @mp.add_model_config_to_megatron_parser("unknown")
    def parse_unknown(plugin, model, batch):
        plugin.parsed = True

    mp.parse_model_config(plugin, model)
    assert plugin.parsed is True
    del mp.MODEL_CONFIGS_TO_MEGATRON_PARSERS["unknown"]


def test_import_accelerando_stays_light():
    code = (
        "import sys, accelerando; print(sorted(m for m in sys.modules if m.startswith('accelerando.utils.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
