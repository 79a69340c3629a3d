"""Behaviour of the reference names added to utils.modeling, .offload, .operations, .deepspeed and
.fsdp_utils (single process; the distributed FSDP save/load round trip is in test_utils_fsdp_save_load_distributed.py)."""

from __future__ import annotations

import base64
import json
import pickle
import warnings

import pytest
import torch
from torch import nn

from accelerando.utils import fsdp_utils, modeling, offload, operations
from accelerando.utils.deepspeed import HfDeepSpeedConfig, map_pytorch_optim_to_deepspeed


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("mask", torch.ones(2), persistent=False)
        self.body[0].register_buffer("steps", torch.zeros(1))
        self.body[1].register_buffer("scratch", torch.zeros(1), persistent=False)


# --- utils.modeling ---------------------------------------------------------------------------------


def test_constants_and_lazy_precision_helpers():
    assert modeling.SAFE_WEIGHTS_NAME == "model.safetensors"
    assert modeling.WEIGHTS_NAME == "pytorch_model.bin"
    assert modeling.WEIGHTS_INDEX_NAME == "pytorch_model.bin.index.json"
    assert callable(modeling.get_grad_scaler) and callable(modeling.get_mixed_precision_context_manager)
    assert "get_grad_scaler" in dir(modeling)


def test_clean_device_map_by_names_in_place():
    full = {"embed": "cpu", "body.0": "cpu", "body.1": "cpu", "head": "cpu"}
    assert modeling.clean_device_map(full) == {"": "cpu"} and full == {"": "cpu"}
    mixed = {"embed": "cpu", "body.0": 0, "body.1": 0, "head": "cpu"}
    assert modeling.clean_device_map(mixed) == {"embed": "cpu", "body": 0, "head": "cpu"}
    # module_name limits the merge to that subtree; other entries stay, the merged one goes last
    # (as in the reference).
    nested = {"x": "cpu", "a.b.c": "cpu", "a.b.d": "cpu", "a.e": 1}
    assert list(modeling.clean_device_map(nested, module_name="a.b").items()) == [
        ("x", "cpu"),
        ("a.e", 1),
        ("a.b", "cpu"),
    ]
    # "body.10" is not under "body.1"; a single entry is never renamed to its parent.
    assert modeling.clean_device_map({"body.1.w": 0, "body.10.w": "cpu"}) == {
        "body.1.w": 0,
        "body.10.w": "cpu",
    }
    assert modeling.clean_device_map({"a.b": 0, "a.c": 0, "a.d.e": 1}) == {"a.b": 0, "a.c": 0, "a.d.e": 1}
    # The model form only merges a parent whose every part is mapped.
    partial = {"body.0": 0, "embed": "cpu", "head": "cpu"}
    assert modeling.clean_device_map(partial, model=Net()) == {"embed": "cpu", "body.0": 0, "head": "cpu"}


def test_check_device_map_names_uncovered_tensors():
    net = Net()
    modeling.check_device_map(net, {"": "cpu"})
    modeling.check_device_map(net, {"embed": "cpu", "body": "cpu", "head": "cpu"})
    with pytest.raises(ValueError, match=r"body\.0\.steps") as error:
        modeling.check_device_map(net, {"embed": "cpu", "head": "cpu"})
    assert "body.1.scratch" not in str(error.value)  # non-persistent buffers need no device


def test_check_device_same():
    assert modeling.check_device_same("cpu", torch.device("cpu"))
    assert modeling.check_device_same(torch.device("cuda"), 0)
    assert modeling.check_device_same("cuda:1", torch.device("cuda", 1))
    assert not modeling.check_device_same("cuda:0", "cuda:1")
    assert not modeling.check_device_same("cpu", 0)


def test_tied_parameter_checks():
    net = Net()
    tied = modeling.find_tied_parameters(net)
    assert tied == [["embed.weight", "head.weight"]]
    assert modeling.check_tied_parameters_on_same_device(tied_params=tied, device_map={"": "cpu"})
    with pytest.warns(UserWarning, match="different devices"):
        assert not modeling.check_tied_parameters_on_same_device(tied, {"embed": "cpu", "body": 0, "head": 0})
    assert modeling.check_tied_parameters_on_same_device(net)  # the model form
    assert modeling.check_tied_parameters_in_config(net) is False  # not a transformers model


def test_check_tied_parameters_in_config_reads_transformers_config():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2
    )
    config.tie_word_embeddings = True
    assert modeling.check_tied_parameters_in_config(transformers.LlamaForCausalLM(config))
    config.tie_word_embeddings = False
    assert not modeling.check_tied_parameters_in_config(transformers.LlamaForCausalLM(config))


def test_id_tensor_storage_and_non_persistent_buffers():
    net = Net()
    assert modeling.id_tensor_storage(net.embed.weight) == modeling.id_tensor_storage(net.head.weight)
    weight = net.body[0].weight
    assert modeling.id_tensor_storage(weight[1:]) == modeling.id_tensor_storage(weight)
    assert modeling.id_tensor_storage(weight) != modeling.id_tensor_storage(net.body[1].weight)
    assert modeling.id_tensor_storage(weight)[2] == weight.numel() * 4
    assert modeling.get_non_persistent_buffers(net) == {"mask"}
    assert modeling.get_non_persistent_buffers(net, recurse=True) == {"mask", "scratch"}
    found = modeling.get_non_persistent_buffers(net, recurse=True, fqns=True)
    assert found == {"mask", "body.1.scratch"}
    found.add("x")
    assert "x" not in net._non_persistent_buffers_set  # a copy, not the module's own set


def test_module_leaves_sizes_with_ties_and_fallback_allocate():
    net = Net()
    sizes = modeling.compute_module_sizes(net)
    leaves = modeling.get_module_leaves(sizes)
    assert "body.0.weight" in leaves and "body" not in leaves and "" not in leaves
    units = list(net.named_children())
    # The embedding's tied partner is the head: placing the embedding means placing the head too.
    size, names, modules = modeling.get_module_size_with_ties(
        ["head.weight"], sizes["embed"], sizes, units[1:]
    )
    assert names == ["head"] and modules == [net.head]
    assert size == sizes["embed"] + sizes["head"] - sizes.get("head.weight", 0)
    assert modeling.get_module_size_with_ties([], 7, sizes, units) == (7, [], [])
    # Nothing fits: the list comes back unchanged (the head alone is free: its weight is the embedding's).
    no_split = ["Sequential", "Linear"]
    assert modeling.fallback_allocate(units[:2], sizes, 1, no_split_module_classes=no_split) == (
        None,
        None,
        units[:2],
    )
    assert modeling.fallback_allocate(units, sizes, "not a size")[0] is None
    # body (2 x 80 bytes) does not fit in 100 bytes; its first Linear does and is taken out of it.
    tied = modeling.find_tied_parameters(net)
    name, module, rest = modeling.fallback_allocate(units, sizes, 100, tied_parameters=tied)
    assert name == "body.0" and module is net.body[0]
    assert [n for n, _ in rest] == ["embed", "body.1", "head"]


def test_set_module_tensor_to_device_non_blocking_and_clear_cache():
    layer = nn.Linear(2, 2)
    modeling.set_module_tensor_to_device(
        layer, "weight", "cpu", value=torch.full((2, 2), 3.0), non_blocking=True, clear_cache=True
    )
    assert torch.equal(layer.weight.detach(), torch.full((2, 2), 3.0))
    modeling.set_module_tensor_to_device(layer, "bias", "meta", non_blocking=False, clear_cache=False)
    assert layer.bias.device.type == "meta"


def test_state_dict_of_offloaded_model(tmp_path):
    from accelerando.big_modeling import cpu_offload, disk_offload

    for offload_fn, kwargs in ((cpu_offload, {}), (disk_offload, {"offload_dir": str(tmp_path)})):
        net = Net()
        expected = {k: v.clone() for k, v in net.state_dict().items()}
        offload_fn(net, execution_device="cpu", **kwargs)
        assert net.body[0].weight.device.type == "meta"
        state = modeling.get_state_dict_offloaded_model(net)
        assert state.keys() == expected.keys()
        assert all(torch.equal(state[k], expected[k]) and state[k].device.type == "cpu" for k in expected)
        assert net.body[0].weight.device.type == "meta"  # offloaded again afterwards
        partial = {"body.0.weight": None, "body.0.steps": None}
        modeling.get_state_dict_from_offload(net.body[0], "body.0.weight", partial)
        assert torch.equal(partial["body.0.weight"], expected["body.0.weight"])
        assert torch.equal(partial["body.0.steps"], expected["body.0.steps"])


def test_is_peft_model():
    assert modeling.is_peft_model(Net()) is False
    peft = pytest.importorskip("peft")
    model = nn.Sequential(nn.Linear(4, 4))
    wrapped = peft.get_peft_model(model, peft.LoraConfig(target_modules=["0"], r=2))
    assert modeling.is_peft_model(wrapped)


# --- utils.offload ----------------------------------------------------------------------------------


def test_extract_submodules_state_dict():
    state = {"a.b": 1, "a.bc": 2, "a": 3, "c.d": 4, "a.b.e": 5}
    assert offload.extract_submodules_state_dict(state, ["a.b"]) == {"a.b": 1, "a.b.e": 5}
    assert offload.extract_submodules_state_dict(state, ["a", "c"]) == {k: v for k, v in state.items()}
    assert offload.extract_submodules_state_dict(state, []) == {}


# --- utils.operations -------------------------------------------------------------------------------


def test_structure_helpers_round_trip():
    batch = {"x": torch.ones(2, 3), "y": [torch.zeros(2, dtype=torch.int64), "label"]}
    structure = operations.get_data_structure(batch)
    assert operations.is_tensor_information(tensor_info=structure["x"])
    assert structure["x"].shape == torch.Size([2, 3]) and structure["y"][0].dtype == torch.int64
    rebuilt = operations.initialize_tensors(structure)
    assert (
        rebuilt["x"].shape == (2, 3) and rebuilt["y"][0].dtype == torch.int64 and rebuilt["y"][1] == "label"
    )
    assert operations.get_shape(batch) == {"x": [2, 3], "y": [[2], "label"]}
    assert operations.find_device(batch) == torch.device("cpu")
    assert operations.find_device({"a": [1, "b"]}) is None
    assert operations.ignorant_find_batch_size(batch) == 2
    assert operations.ignorant_find_batch_size({"a": 1}) is None
    assert operations.ignorant_find_batch_size([]) is None
    assert operations.is_torch_tensor(tensor=torch.ones(1)) and not operations.is_torch_tensor([1])
    assert not operations.is_torch_xpu_tensor(torch.ones(1))


@pytest.mark.parametrize(
    ("batch", "processes", "expected"), [(5, 2, 6), (3, 4, 4), (7, 3, 9), (8, 4, 8), (9, 4, 12)]
)
def test_pad_input_tensors_reaches_a_multiple(batch, processes, expected):
    data = {"ids": torch.arange(batch * 2).reshape(batch, 2) + 1}
    padded = operations.pad_input_tensors(data, batch_size=batch, num_processes=processes)
    assert padded["ids"].shape == (expected, 2)
    assert torch.equal(padded["ids"][:batch], data["ids"]) and not padded["ids"][batch:].any()
    along_1 = operations.pad_input_tensors(torch.ones(2, batch), batch, processes, dim=1)
    assert along_1.shape == (2, expected)
    with pytest.raises(ValueError, match="num_processes"):
        operations.pad_input_tensors(torch.ones(2), 2, 0)


def test_convert_outputs_to_fp32_class_refuses_pickling():
    forward = operations.ConvertOutputsToFp32(lambda x: {"out": x.half(), "n": 1})
    result = forward(torch.ones(2))
    assert result["out"].dtype == torch.float32 and result["n"] == 1
    with pytest.raises(pickle.PicklingError, match="unwrap"):
        pickle.dumps(forward)


def test_operation_decorators_and_constants():
    assert issubclass(operations.CannotPadNestedTensorWarning, UserWarning)
    assert "FSDP" in operations.TORCH_DISTRIBUTED_OPERATION_TYPES
    assert "MULTI_CPU" in operations.TORCH_DISTRIBUTED_OPERATION_TYPES
    assert "NO" not in operations.TORCH_DISTRIBUTED_OPERATION_TYPES

    @operations.verify_operation
    def identity(tensor):
        return tensor

    assert identity(tensor=torch.ones(1)).item() == 1  # a single process: nothing to compare

    @operations.chained_operation
    def composite():
        raise operations.DistributedOperationException("inner")

    with pytest.raises(operations.DistributedOperationException, match="composite") as error:
        composite()
    assert str(error.value.__cause__) == "inner"


def test_copy_tensor_to_devices_and_gathered_parameters_single_process():
    tensor = torch.arange(3)
    assert operations.copy_tensor_to_devices(tensor) is tensor
    with pytest.raises(ValueError, match="holds it"):
        operations.copy_tensor_to_devices(None)
    shape, code = operations.gather_tensor_shape(torch.ones(2, 5, dtype=torch.bfloat16))
    assert shape.tolist() == [2, 5] and isinstance(code, int)
    layer = nn.Linear(2, 2)
    with operations.GatheredParameters(layer.parameters(), modifier_rank=0):
        assert layer.weight.shape == (2, 2)  # not sharded: the context does nothing
    with operations.GatheredParameters(layer.weight, enabled=False):
        pass


# --- utils.deepspeed --------------------------------------------------------------------------------

ZERO3 = {
    "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}},
    "bf16": {"enabled": True},
    "fp16": {"enabled": False},
}


def test_hf_deepspeed_config_queries(tmp_path):
    config = HfDeepSpeedConfig(ZERO3)
    assert config.config is not ZERO3 and config.config == ZERO3  # a private copy
    assert config.is_zero3() and not config.is_zero2() and config.is_offload()
    assert config.get_value("zero_optimization.offload_param.device") == "cpu"
    assert config.get_value("zero_optimization.missing.key", "x") == "x"
    assert config.get_value("train_micro_batch_size_per_gpu") == 2
    assert config.is_true("bf16.enabled") and config.is_false("fp16.enabled")
    assert not config.is_true("nothing.here") and not config.is_false("nothing.here")
    node, key = config.find_config_node("zero_optimization.offload_param.device")
    assert node == {"device": "cpu"} and key == "device"
    assert config.find_config_node("nope.device") == (None, "device")
    config.del_config_sub_tree("zero_optimization.offload_param")
    config.del_config_sub_tree("not.there")
    with pytest.raises(ValueError, match="not in the DeepSpeed config"):
        config.del_config_sub_tree("not.there", must_exist=True)
    config.set_stage_and_offload()
    assert not config.is_offload()

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}}))
    from_file = HfDeepSpeedConfig(str(path))
    assert from_file.is_zero2() and from_file.is_offload()
    assert HfDeepSpeedConfig(path).is_zero2()
    encoded = base64.urlsafe_b64encode(json.dumps({"zero_optimization": {"stage": 1}}).encode()).decode()
    assert HfDeepSpeedConfig(encoded).get_value("zero_optimization.stage") == 1
    assert not HfDeepSpeedConfig(
        {"zero_optimization": {"stage": 1, "offload_param": {"device": "cpu"}}}
    ).is_offload()
    with pytest.raises(ValueError, match="no such file"):
        HfDeepSpeedConfig("missing.json")
    with pytest.raises(ValueError, match="got list"):
        HfDeepSpeedConfig([1])


def test_map_pytorch_optim_rejects_non_optimizers():
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        map_pytorch_optim_to_deepspeed(object())


@pytest.mark.slow
def test_map_pytorch_optim_to_deepspeed_builds_cpu_optimizers():
    """Builds DeepSpeed's CPU Adam/Adagrad kernels (a C++ compile on first use)."""
    pytest.importorskip("deepspeed")
    model = nn.Linear(4, 4)
    adamw = map_pytorch_optim_to_deepspeed(torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1))
    assert type(adamw).__name__ == "DeepSpeedCPUAdam" and adamw.adam_w_mode
    assert adamw.param_groups[0]["lr"] == 0.01 and adamw.param_groups[0]["params"][0] is model.weight
    adam = map_pytorch_optim_to_deepspeed(torch.optim.Adam(model.parameters()))
    assert not adam.adam_w_mode
    adagrad = map_pytorch_optim_to_deepspeed(torch.optim.Adagrad(model.parameters(), lr=0.5))
    assert type(adagrad).__name__ == "DeepSpeedCPUAdagrad"
    with pytest.warns(UserWarning, match="SGD"):
        assert type(map_pytorch_optim_to_deepspeed(torch.optim.SGD(model.parameters(), lr=1))).__name__ == (
            "DeepSpeedCPUAdam"
        )
    model(torch.ones(1, 4)).sum().backward()
    before = model.weight.detach().clone()
    adamw.step()
    assert not torch.equal(before, model.weight.detach())


# --- utils.fsdp_utils (single-process parts) --------------------------------------------------------


def test_fsdp_utils_constants_and_name_helpers():
    assert fsdp_utils.FSDP_MODEL_NAME == "pytorch_model_fsdp" and fsdp_utils.OPTIMIZER_NAME == "optimizer"
    assert (
        fsdp_utils.SAFE_WEIGHTS_NAME == "model.safetensors" and fsdp_utils.WEIGHTS_NAME == "pytorch_model.bin"
    )
    names = {"layers.0._checkpoint_wrapped_module.weight": 1, "_orig_mod.head.bias": 2, "plain": 3}
    assert fsdp_utils.fsdp2_canonicalize_names(names) == {"layers.0.weight": 1, "head.bias": 2, "plain": 3}


def test_fsdp2_switch_optimizer_parameters():
    old = nn.Linear(2, 2)
    new = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(old.parameters(), lr=0.1)
    mapping = {old.weight.data_ptr(): new.weight, old.bias.data_ptr(): new.bias}
    fsdp_utils.fsdp2_switch_optimizer_parameters(optimizer, mapping)
    assert optimizer.param_groups[0]["params"] == [new.weight, new.bias]
    with pytest.raises(KeyError, match="no sharded counterpart"):
        fsdp_utils.fsdp2_switch_optimizer_parameters(torch.optim.SGD(old.parameters(), lr=0.1), {})


def test_get_parameters_from_modules_and_grad_scaler():
    net = Net()
    by_regex = fsdp_utils.get_parameters_from_modules(r"body\.\d", net, "cpu")
    assert by_regex == set(net.body.parameters())
    assert fsdp_utils.get_parameters_from_modules([net.embed], net, None) == {net.embed.weight}
    assert fsdp_utils.get_parameters_from_modules(None, net, "cpu") == set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GradScaler warns when the device has no fp16 scaling support
        assert isinstance(fsdp_utils.get_fsdp2_grad_scaler(init_scale=8.0), torch.amp.GradScaler)


def test_fsdp2_prepare_auto_wrap_policy():
    from accelerando import FullyShardedDataParallelPlugin

    net = Net()
    plugin = FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Linear"])
    policy = fsdp_utils.fsdp2_prepare_auto_wrap_policy(plugin, net)
    assert policy(net.body[0]) and policy(net.head) and not policy(net.body) and not policy(net)
    assert (
        fsdp_utils.fsdp2_prepare_auto_wrap_policy(
            FullyShardedDataParallelPlugin(auto_wrap_policy="NO_WRAP"), net
        )
        is None
    )


def test_ensure_weights_retied_keeps_ties_through_init():
    with torch.device("meta"):
        net = Net()
    assert fsdp_utils.ensure_weights_retied(str, nn.Linear(2, 2), "cpu") is str  # no ties: unchanged

    def materialise(module):
        module.to_empty(device="cpu", recurse=False)
        return module

    init = fsdp_utils.ensure_weights_retied(materialise, net, torch.device("cpu"))
    for module in net.modules():
        init(module)
    assert net.embed.weight.device.type == "cpu" and net.head.weight is net.embed.weight
