"""Checkpoint loading, offload format, tensor placement and empty initialisation."""

from __future__ import annotations

import argparse
import json
import os

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from accelerando.big_modeling import (
    cpu_offload_with_hook,
    dispatch_model,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
)
from accelerando.commands import estimate
from accelerando.hooks import remove_hook_from_submodules
from accelerando.utils.modeling import (
    check_tied_parameters_on_same_device,
    find_tied_parameters,
    get_module_children_bottom_up,
    load_checkpoint_in_model,
    load_state_dict,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)
from accelerando.utils.offload import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    load_offloaded_weights,
    offload_state_dict,
)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("steps", torch.tensor([3], dtype=torch.int64))
        self.register_buffer("cache", torch.zeros(2), persistent=False)

    def forward(self, ids):
        return self.head(self.norm(self.body(self.embed(ids))))


def _reference() -> tuple[Net, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = Net()
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "head.weight"}
    return model, state


def test_load_checkpoint_reports_missing_and_unexpected_keys(tmp_path):
    reference, state = _reference()
    state.pop("norm.bias")
    state["extra.weight"] = torch.ones(1)
    save_file(state, tmp_path / "model.safetensors")
    with init_empty_weights():
        model = Net()
    missing, unexpected = load_checkpoint_in_model(model, tmp_path)
    assert missing == ["norm.bias"] and unexpected == ["extra.weight"]
    assert model.head.weight is model.embed.weight
    with pytest.raises(ValueError, match="strict=False"):
        load_checkpoint_in_model(Net(), tmp_path / "model.safetensors", strict=True)


def test_dtype_cast_keeps_integers_and_fp32_modules(tmp_path):
    _, state = _reference()
    save_file(state, tmp_path / "model.safetensors")
    with init_empty_weights():
        model = Net()
    load_checkpoint_in_model(model, tmp_path, dtype=torch.float16, keep_in_fp32_modules=["norm"])
    assert model.body[0].weight.dtype == torch.float16
    assert model.norm.weight.dtype == torch.float32
    assert model.steps.dtype == torch.int64 and model.steps.item() == 3


def test_bin_sharded_index_and_folder_layouts(tmp_path):
    reference, state = _reference()
    names = sorted(state)
    first, second = names[: len(names) // 2], names[len(names) // 2 :]
    torch.save({k: state[k] for k in first}, tmp_path / "a.bin")
    torch.save({k: state[k] for k in second}, tmp_path / "b.bin")
    weight_map = {**dict.fromkeys(first, "a.bin"), **dict.fromkeys(second, "b.bin")}
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    ids = torch.tensor([[1, 2, 3]])
    for target in (tmp_path, tmp_path / "pytorch_model.bin.index.json"):
        with init_empty_weights():
            model = Net()
        assert load_checkpoint_in_model(model, target) == ([], [])
        torch.testing.assert_close(model(ids), reference(ids))
    loaded = load_state_dict(tmp_path / "a.bin", device_map={"": "cpu"})
    assert set(loaded) == set(first)
    with pytest.raises(ValueError, match="does not exist"):
        load_checkpoint_in_model(Net(), tmp_path / "nope")


def test_disk_map_needs_a_folder_and_indexes_safetensors_in_place(tmp_path):
    reference, state = _reference()
    save_file(state, tmp_path / "model.safetensors")
    device_map = {"embed": "cpu", "head": "cpu", "body": "disk", "norm": "cpu", "steps": "cpu"}
    with init_empty_weights():
        model = Net()
    with pytest.raises(ValueError, match="offload_folder"):
        load_checkpoint_in_model(model, tmp_path, device_map=device_map)
    with init_empty_weights():
        model = Net()
    model = load_checkpoint_and_dispatch(
        model, tmp_path, device_map=device_map, offload_folder=tmp_path / "off"
    )
    index = json.loads((tmp_path / "off" / "index.json").read_text())
    assert set(index) == {"body.0.weight", "body.0.bias", "body.1.weight", "body.1.bias"}
    assert all(entry["safetensors_file"].endswith("model.safetensors") for entry in index.values())
    ids = torch.tensor([[4, 5]])
    torch.testing.assert_close(model(ids), reference(ids))
    with pytest.raises(RuntimeError, match="remove_hook_from_submodules"):
        model.to("cpu")
    remove_hook_from_submodules(model)
    model.to("cpu")
    torch.testing.assert_close(model(ids), reference(ids))


def test_offload_roundtrip_with_bfloat16(tmp_path):
    state = {"a.weight": torch.randn(3, 2).to(torch.bfloat16), "b": torch.arange(4), "empty": torch.ones(0)}
    index = offload_state_dict(tmp_path, state)
    assert index["a.weight"] == {"dtype": "bfloat16", "shape": [3, 2]}
    loader = OffloadedWeightsLoader(save_folder=tmp_path)
    assert set(loader) == set(state) and len(loader) == 3
    for name, tensor in state.items():
        torch.testing.assert_close(loader[name], tensor)
    prefixed = PrefixedDataset(loader, "a.")
    assert list(prefixed) == ["weight"] and "weight" in prefixed and len(prefixed) == 1
    model = nn.Module()
    model.a = nn.Linear(2, 3, bias=False).to(torch.bfloat16)
    load_offloaded_weights(model, {"a.weight": index["a.weight"]}, tmp_path)
    torch.testing.assert_close(model.a.weight.data, state["a.weight"])
    with pytest.raises(ValueError, match="state_dict"):
        OffloadedWeightsLoader()


def test_set_module_tensor_to_device_rules():
    model = Net()
    with pytest.raises(ValueError, match="no parameter or buffer"):
        set_module_tensor_to_device(model, "body.0.nothing", "cpu")
    with pytest.raises(ValueError, match="this looks incorrect"):
        set_module_tensor_to_device(model, "body.0.weight", "cpu", value=torch.ones(2, 2))
    set_module_tensor_to_device(model, "body.0.weight", "meta")
    with pytest.raises(ValueError, match="meta device"):
        set_module_tensor_to_device(model, "body.0.weight", "cpu")
    value = torch.ones(4, 4, dtype=torch.float64)
    set_module_tensor_to_device(model, "body.0.weight", "cpu", value=value)
    assert model.body[0].weight.dtype == torch.float32 and isinstance(model.body[0].weight, nn.Parameter)
    same = torch.ones(4, 4)
    set_module_tensor_to_device(model, "body.0.weight", "cpu", value=same)
    assert model.body[0].weight.data_ptr() == same.data_ptr()  # no copy
    set_module_tensor_to_device(model, "body.1.bias", "cpu", value=torch.zeros(4), dtype=torch.float16)
    assert model.body[1].bias.dtype == torch.float16


def test_init_empty_weights_variants():
    class Custom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_parameter("w", nn.Parameter(torch.randn(1000, 1000, device="cpu")))
            self.register_buffer("pos", torch.arange(5))

    with init_empty_weights():
        model = Custom()
        embed = nn.Embedding(5, 3)
    assert model.w.device.type == "meta" and embed.weight.device.type == "meta"
    assert model.pos.device.type == "cpu" and model.pos.tolist() == [0, 1, 2, 3, 4]
    register_parameter, register_buffer = nn.Module.register_parameter, nn.Module.register_buffer
    with init_empty_weights(include_buffers=True):
        # as in the reference: only ``torch.device("meta")`` is entered, registration is not patched,
        # so a tensor created with an explicit device stays there
        assert nn.Module.register_parameter is register_parameter
        assert nn.Module.register_buffer is register_buffer
        model = Custom()
    assert model.pos.device.type == "meta" and model.w.device.type == "cpu"
    with init_on_device("cpu"):
        assert nn.Linear(2, 2).weight.device.type == "cpu"
    assert torch.empty(1).device.type == "cpu" and "normal_" not in torch.Tensor.__dict__


def test_tied_helpers_and_bottom_up_order():
    model = Net()
    assert find_tied_parameters(model) == [["embed.weight", "head.weight"]]
    assert check_tied_parameters_on_same_device(model)
    with pytest.warns(UserWarning, match="different devices"):
        assert not check_tied_parameters_on_same_device(
            [["embed.weight", "head.weight"]], {"embed": "cpu", "head": 0}
        )
    model.head.weight = nn.Parameter(torch.zeros(10, 4))
    retie_parameters(model, [["embed.weight", "head.weight"]])
    assert model.head.weight is model.embed.weight
    order = get_module_children_bottom_up(model, return_fqns=True)
    names = [name for name, _ in order]
    assert names[-1] == "" and names.index("body.0") < names.index("body")
    assert dict(named_module_tensors(model, remove_non_persistent=True)).keys() == {"steps"}


def test_dispatch_model_single_device_and_errors():
    reference, _ = _reference()
    model = dispatch_model(reference, {"": "cpu"})
    assert model.hf_device_map == {"": "cpu"} and not hasattr(model, "_hf_hook")
    with pytest.raises(ValueError, match="does not cover"):
        dispatch_model(Net(), {"embed": "cpu"})
    with pytest.raises(ValueError, match="offload_dir"):
        dispatch_model(Net(), {"": "disk"})
    with pytest.raises(ValueError, match="device_map must be"):
        load_checkpoint_and_dispatch(Net(), "x", device_map="fastest")


def test_cpu_offload_with_hook_chains_models():
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    first, hook_1 = cpu_offload_with_hook(first, execution_device="cpu")
    second, hook_2 = cpu_offload_with_hook(second, execution_device="cpu", prev_module_hook=hook_1)
    offloaded = []
    original = hook_1.offload
    hook_1.offload = lambda: (offloaded.append(True), original())
    expected = second.weight @ (first.weight @ torch.ones(2) + first.bias) + second.bias
    torch.testing.assert_close(second(first(torch.ones(2))), expected)
    assert offloaded == [True]  # running the second model offloaded the first one
    assert hook_2.hook.execution_device == torch.device("cpu")
    hook_1.remove()
    assert not hasattr(first, "_hf_hook")


def test_estimate_memory_from_headers_and_cli(tmp_path, capsys):
    save_file(
        {"layers.0.w": torch.zeros(10, 10), "layers.1.w": torch.zeros(10, 20), "head": torch.zeros(5)},
        tmp_path / "m.safetensors",
    )
    assert estimate.estimate_sizes(str(tmp_path)) == (305, 200, "layers.1")
    parser = argparse.ArgumentParser()
    estimate.add_parser(parser.add_subparsers())
    args = parser.parse_args(["estimate-memory", str(tmp_path), "--dtypes", "float32", "int4"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "float32" in out and "int4" in out and "1.19 KB" in out and "float16" not in out
    assert estimate.main([str(tmp_path / "missing")]) == 1


def test_estimate_memory_from_transformers_config(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=8, n_layer=2, n_head=2)
    config.save_pretrained(tmp_path)
    total, largest, name = estimate.estimate_sizes(str(tmp_path))
    assert total == transformers.GPT2Model(config).num_parameters() and 0 < largest < total and name
    assert os.listdir(tmp_path) == ["config.json"]


def test_library_progress_helper_and_shard_layout_needs_dtensors(tmp_path):
    import torch

    from accelerando.common.progress import progress
    from accelerando.utils.modeling import load_checkpoint_in_model

    items = list(range(5))
    wrapped = progress(items, desc="x")
    assert list(wrapped) == items and wrapped is not items  # a tqdm bar over several items
    assert progress([1], desc="x") == [1]  # nothing to show for one item
    model = torch.nn.Linear(2, 2)
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    with pytest.raises(ValueError, match="full_state_dict=True"):
        load_checkpoint_in_model(model, str(path), full_state_dict=False)
