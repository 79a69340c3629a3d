"""Quantised loading through bitsandbytes (CPU backend): accuracy, memory, device maps, offload, errors.

Tolerances (relative error ``||out - ref|| / ||ref||`` of the tiny model's output against the
full-precision model, measured on this CPU with bitsandbytes 0.50.2):

- 8-bit (LLM.int8(), threshold 6.0): measured ~0.0035, asserted <= 0.02;
- 4-bit fp4 / nf4 (compute dtype float32 or the default float16): measured ~0.046-0.055, asserted <= 0.12.

Each quantised output must also differ from the reference (relative error > 1e-4), which shows
the layers really run quantised.
"""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from torch import nn

from accelerando.big_modeling import init_empty_weights
from accelerando.big_modeling import quantization as bnb_utils
from accelerando.big_modeling.quantization import (
    BnbQuantizationConfig,
    get_keys_to_not_convert,
    get_parameter_device,
    get_quantized_model_device_map,
    has_4bit_bnb_layers,
    load_and_quantize_model,
    quantize_and_offload_8bit,
    replace_with_bnb_layers,
)

REL_TOL_8BIT = 0.02
REL_TOL_4BIT = 0.12

bnb = pytest.importorskip("bitsandbytes")


class Block(nn.Module):
    def __init__(self, dim: int = 64, hidden: int = 256) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, torch.Tensor, torch.Tensor, nn.Module]:
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = TinyNet().eval()
    folder = tmp_path_factory.mktemp("tiny_ckpt")
    save_file(model.state_dict(), os.path.join(folder, "model.safetensors"))
    x = torch.randn(32, 64)
    with torch.no_grad():
        y = model(x)
    return str(folder), x, y, model


def _empty() -> nn.Module:
    with init_empty_weights():
        return TinyNet().eval()


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def _model_bytes(model: nn.Module) -> int:
    """Bytes of parameters, buffers and the quantisation statistics bitsandbytes keeps beside them."""
    total = sum(t.numel() * t.element_size() for t in model.parameters() if t.device.type != "meta")
    total += sum(t.numel() * t.element_size() for t in model.buffers())
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear8bitLt):
            scb = module.weight.SCB if module.weight.SCB is not None else module.state.SCB
            total += 0 if scb is None else scb.numel() * scb.element_size()
        if isinstance(module, bnb.nn.Linear4bit) and module.weight.quant_state is not None:
            state = module.weight.quant_state.as_dict()
            total += sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))
    return total


def _run(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x)


# -------------------------------------------------------------------------------------------------
# Config
# -------------------------------------------------------------------------------------------------


def test_config_defaults_match_the_reference() -> None:
    config = BnbQuantizationConfig(load_in_8bit=True)
    assert config.llm_int8_threshold == 6.0
    assert config.bnb_4bit_quant_type == "fp4"
    assert config.bnb_4bit_use_double_quant is False
    assert config.bnb_4bit_compute_dtype is torch.float16  # reference default "fp16", stored as a dtype
    assert config.torch_dtype is None and config.skip_modules is None and config.keep_in_fp32_modules is None
    assert config.target_dtype is torch.int8
    assert str(BnbQuantizationConfig(load_in_4bit=True).target_dtype) == "int4"
    assert BnbQuantizationConfig(load_in_4bit=True, torch_dtype="bf16").torch_dtype is torch.bfloat16


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"load_in_8bit": True, "load_in_4bit": True}, "choose one"),
        ({}, "load_in_8bit=True or load_in_4bit=True"),
        ({"load_in_4bit": True, "bnb_4bit_compute_dtype": "fp12"}, "bnb_4bit_compute_dtype='fp12'"),
        ({"load_in_8bit": True, "torch_dtype": "float17"}, "torch_dtype='float17'"),
        ({"load_in_8bit": True, "torch_dtype": torch.int32}, "floating-point"),
        ({"load_in_4bit": True, "bnb_4bit_quant_type": "int4"}, "'fp4' or 'nf4'"),
        ({"load_in_8bit": "yes"}, "load_in_8bit must be True or False"),
        ({"load_in_8bit": True, "llm_int8_threshold": "6"}, "llm_int8_threshold must be a number"),
        ({"load_in_8bit": True, "skip_modules": "head"}, "skip_modules must be a list"),
    ],
)
def test_config_bad_inputs_are_clear_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        BnbQuantizationConfig(**kwargs)


# -------------------------------------------------------------------------------------------------
# Accuracy and memory
# -------------------------------------------------------------------------------------------------


def test_8bit_load_from_checkpoint_is_accurate_and_smaller(checkpoint, capsys) -> None:
    folder, x, y, reference = checkpoint
    model = load_and_quantize_model(
        _empty(), BnbQuantizationConfig(load_in_8bit=True), weights_location=folder
    )
    assert model.is_loaded_in_8bit and not model.is_loaded_in_4bit
    assert isinstance(model.blocks[0].fc1, bnb.nn.Linear8bitLt)
    assert type(model.head) is nn.Linear  # the output head is kept by default
    assert model.blocks[0].fc1.weight.dtype == torch.int8
    out = _run(model, x)
    rel = _rel(out, y)
    assert 1e-4 < rel <= REL_TOL_8BIT
    before, after = _model_bytes(reference), _model_bytes(model)
    with capsys.disabled():
        print(
            f"\n8-bit: rel err {rel:.4f}, max abs {(out - y).abs().max().item():.4g}; bytes {before} -> {after}"
        )
    # Linear weights go from 4 bytes to 1 byte (+ one float scale per row); biases and the head stay fp32.
    assert after < 0.35 * before


@pytest.mark.parametrize("quant_type", ["fp4", "nf4"])
@pytest.mark.parametrize("compute_dtype", ["fp32", "fp16"])
def test_4bit_load_from_checkpoint_is_accurate_and_smaller(
    checkpoint, capsys, quant_type, compute_dtype
) -> None:
    folder, x, y, reference = checkpoint
    config = BnbQuantizationConfig(
        load_in_4bit=True, bnb_4bit_quant_type=quant_type, bnb_4bit_compute_dtype=compute_dtype
    )
    model = load_and_quantize_model(_empty(), config, weights_location=folder)
    assert model.is_loaded_in_4bit and has_4bit_bnb_layers(model)
    assert model.blocks[1].fc2.weight.quant_type == quant_type
    out = _run(model, x)
    rel = _rel(out, y)
    assert 1e-4 < rel <= REL_TOL_4BIT
    before, after = _model_bytes(reference), _model_bytes(model)
    with capsys.disabled():
        print(f"\n4-bit {quant_type}/{compute_dtype}: rel err {rel:.4f}; bytes {before} -> {after}")
    assert after < 0.25 * before


def test_loaded_model_is_quantized_in_place(checkpoint, caplog) -> None:
    _, x, y, reference = checkpoint
    model = TinyNet().eval()
    model.load_state_dict(reference.state_dict())
    with caplog.at_level(logging.WARNING, logger="accelerando.big_modeling.quantization"):
        model = load_and_quantize_model(
            model, BnbQuantizationConfig(load_in_8bit=True), device_map={"": "cpu"}
        )
    assert "init_empty_weights" in caplog.text and "device_map" in caplog.text
    assert isinstance(model.blocks[0].fc2, bnb.nn.Linear8bitLt)
    assert _rel(_run(model, x), y) <= REL_TOL_8BIT


# -------------------------------------------------------------------------------------------------
# Modules kept unquantised, dtypes
# -------------------------------------------------------------------------------------------------


def test_skip_keep_fp32_and_torch_dtype(checkpoint) -> None:
    folder, *_ = checkpoint
    config = BnbQuantizationConfig(
        load_in_4bit=True,
        torch_dtype=torch.bfloat16,
        keep_in_fp32_modules=["blocks.1.fc2"],
        skip_modules=["fc1"],
    )
    model = load_and_quantize_model(_empty(), config, weights_location=folder)
    # skip_modules replaces the default (the head is converted now); "fc1" matches every block's fc1.
    assert isinstance(model.head, bnb.nn.Linear4bit)
    assert type(model.blocks[0].fc1) is nn.Linear and model.blocks[0].fc1.weight.dtype == torch.bfloat16
    assert type(model.blocks[1].fc2) is nn.Linear and model.blocks[1].fc2.weight.dtype == torch.float32
    assert isinstance(model.blocks[0].fc2, bnb.nn.Linear4bit)
    assert config.skip_modules == ["fc1"]  # the caller's config is not changed


def test_threshold_reaches_the_layers(checkpoint) -> None:
    folder, x, y, _ = checkpoint
    config = BnbQuantizationConfig(load_in_8bit=True, llm_int8_threshold=0.0)
    model = load_and_quantize_model(_empty(), config, weights_location=folder)
    assert model.blocks[0].fc1.state.threshold == 0.0
    assert _rel(_run(model, x), y) <= REL_TOL_8BIT


def test_get_keys_to_not_convert() -> None:
    assert get_keys_to_not_convert(TinyNet()) == ["head"]

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 8)
            self.mid = nn.Linear(8, 8)
            self.lm_head = nn.Linear(8, 10, bias=False)
            self.lm_head.weight = self.embed.weight

    # tied weights first, then the owner of the last (deduplicated) parameter
    assert sorted(get_keys_to_not_convert(Tied())) == ["embed", "lm_head", "mid"]

    class Base(nn.Module):
        base_model_prefix = "model"

        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

    assert get_keys_to_not_convert(Base()) == []


def test_replace_with_bnb_layers_and_helpers() -> None:
    model = _empty()
    config = BnbQuantizationConfig(load_in_8bit=True)
    replace_with_bnb_layers(model, config, modules_to_not_convert=["blocks.0"])
    assert type(model.blocks[0].fc1) is nn.Linear and type(model.blocks[0].fc2) is nn.Linear
    assert isinstance(model.blocks[1].fc1, bnb.nn.Linear8bitLt)
    assert model.blocks[1].fc1.weight.device.type == "meta"  # nothing allocated for an empty model
    assert get_parameter_device(model).type == "meta"
    assert not has_4bit_bnb_layers(model)
    with pytest.raises(ValueError, match="no parameters or buffers"):
        get_parameter_device(nn.ReLU())


# -------------------------------------------------------------------------------------------------
# Device maps and offload
# -------------------------------------------------------------------------------------------------


def test_8bit_cpu_and_disk_offload(checkpoint, tmp_path) -> None:
    folder, x, y, _ = checkpoint
    in_memory = _run(
        load_and_quantize_model(_empty(), BnbQuantizationConfig(load_in_8bit=True), weights_location=folder),
        x,
    )
    device_map = {"blocks.0": "cpu", "blocks.1": "disk", "head": "cpu"}
    model = load_and_quantize_model(
        _empty(),
        BnbQuantizationConfig(load_in_8bit=True),
        weights_location=folder,
        device_map=device_map,
        offload_folder=tmp_path,
    )
    assert model.hf_device_map == device_map
    index = json.loads((tmp_path / "index.json").read_text())
    # 8-bit weights are stored quantised on disk, with their per-row scales.
    assert index["blocks.1.fc1.weight"]["dtype"] == "int8"
    assert index["blocks.1.fc1.SCB"]["dtype"] == "float32"
    assert model.blocks[1].fc1.weight.device.type == "meta"
    first, second = _run(model, x), _run(model, x)
    assert torch.equal(first, in_memory) and torch.equal(second, in_memory)
    assert model.blocks[1].fc1.weight.device.type == "meta"  # back on meta after the forward


def test_4bit_disk_offload_with_a_dict_map(checkpoint, tmp_path) -> None:
    folder, x, y, _ = checkpoint
    config = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="fp32")
    in_memory = _run(load_and_quantize_model(_empty(), config, weights_location=folder), x)
    model = load_and_quantize_model(
        _empty(),
        config,
        weights_location=folder,
        device_map={"blocks.0": "disk", "blocks.1": "cpu", "head": "cpu"},
        offload_folder=tmp_path,
    )
    assert torch.equal(_run(model, x), in_memory)
    assert _rel(_run(model, x), y) <= REL_TOL_4BIT


def test_auto_map_with_small_budget_offloads_8bit_to_disk(checkpoint, tmp_path) -> None:
    folder, x, y, _ = checkpoint
    config = BnbQuantizationConfig(load_in_8bit=True)
    model = load_and_quantize_model(
        _empty(),
        config,
        weights_location=folder,
        device_map="sequential",
        max_memory={"cpu": 40_000},
        offload_folder=tmp_path,
    )
    assert "disk" in set(model.hf_device_map.values()), model.hf_device_map
    assert _rel(_run(model, x), y) <= REL_TOL_8BIT


def test_auto_map_refuses_to_offload_4bit_layers(tmp_path) -> None:
    model = _empty()
    config = BnbQuantizationConfig(load_in_4bit=True)
    replace_with_bnb_layers(model, config, modules_to_not_convert=["head"])
    with pytest.raises(ValueError, match="4-bit layers"):
        get_quantized_model_device_map(model, config, "sequential", max_memory={"cpu": 10_000})
    with pytest.raises(ValueError, match="device_map must be a dict or one of"):
        get_quantized_model_device_map(model, config, "everywhere")
    assert get_quantized_model_device_map(model, config, None) in ({"": "cpu"}, {"": 0})


def test_quantize_and_offload_8bit_writes_int8_and_scales(tmp_path) -> None:
    model = nn.Sequential(nn.Linear(64, 32))
    weight = model[0].weight.detach().clone()
    index: dict = {}
    quantize_and_offload_8bit(model, weight, "0.weight", None, tmp_path, index, None)
    assert index["0.weight"]["dtype"] == "int8" and index["0.SCB"]["shape"] == [32]
    assert model[0].weight.device.type == "meta"
    assert (tmp_path / "0.weight.dat").stat().st_size == 32 * 64


# -------------------------------------------------------------------------------------------------
# Errors
# -------------------------------------------------------------------------------------------------


def test_bitsandbytes_missing_or_too_old_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(bnb_utils, "is_bnb_available", lambda *args: False)
    with pytest.raises(ImportError, match="pip install bitsandbytes"):
        load_and_quantize_model(_empty(), BnbQuantizationConfig(load_in_8bit=True), weights_location="x")
    assert has_4bit_bnb_layers(nn.Linear(2, 2)) is False
    monkeypatch.setattr(bnb_utils, "is_bnb_available", lambda *args: True)
    monkeypatch.setattr(bnb_utils, "is_4bit_bnb_available", lambda: False)
    with pytest.raises(ImportError, match="0.39.0"):
        load_and_quantize_model(_empty(), BnbQuantizationConfig(load_in_4bit=True), weights_location="x")


def test_mode_the_hardware_cannot_run_is_a_clear_error(checkpoint, monkeypatch) -> None:
    folder, *_ = checkpoint
    monkeypatch.setattr(bnb_utils, "_probe", lambda mode, device: "NotImplementedError: no kernel")
    with pytest.raises(RuntimeError, match="cannot run 8-bit layers on 'cpu'.*CPU backend"):
        load_and_quantize_model(_empty(), BnbQuantizationConfig(load_in_8bit=True), weights_location=folder)


def test_bad_calls_are_clear_errors(checkpoint) -> None:
    folder, *_ = checkpoint
    config = BnbQuantizationConfig(load_in_8bit=True)
    with pytest.raises(ValueError, match="pass weights_location"):
        load_and_quantize_model(_empty(), config)
    with pytest.raises(ValueError, match="pass offload_folder"):
        load_and_quantize_model(
            _empty(), config, weights_location=folder, device_map={"blocks": "disk", "head": "cpu"}
        )
    with pytest.raises(ValueError, match="must be a BnbQuantizationConfig"):
        load_and_quantize_model(_empty(), {"load_in_8bit": True}, weights_location=folder)
