"""DeepSpeed: ACCELERATE_CONFIG_DS_FIELDS refusals and MoE leaf modules under ZeRO-3."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

from accelerando import DeepSpeedPlugin
from accelerando.backends.strategies.deepspeed.strategy import _mark_moe_leaves


@pytest.fixture(autouse=True)
def _no_launcher_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if "DEEPSPEED" in name or name.endswith(
            ("GRADIENT_ACCUMULATION_STEPS", "GRADIENT_CLIPPING", "DS_FIELDS")
        ):
            monkeypatch.delenv(name)


def _config_file(tmp_path) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}))
    return str(path)


# ------------------------------------------------------------------------------ config_ds_fields
def test_config_file_fields_clashing_with_a_deepspeed_file_are_refused(tmp_path, monkeypatch) -> None:
    path = _config_file(tmp_path)
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", "deepspeed_config_file,zero_stage,gradient_clipping")
    with pytest.raises(ValueError, match=r"\['zero_stage', 'gradient_clipping'\]"):
        DeepSpeedPlugin(hf_ds_config=path)
    DeepSpeedPlugin(zero_stage=2)  # no DeepSpeed file: the launcher's fields build the config
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", "deepspeed_config_file,zero3_init_flag")
    assert DeepSpeedPlugin(hf_ds_config=path).zero_stage == 2  # fields a DeepSpeed file cannot hold are fine
    monkeypatch.delenv("ACCELERATE_CONFIG_DS_FIELDS")
    assert DeepSpeedPlugin(hf_ds_config=path).zero_stage == 2


# ------------------------------------------------------------------------------ MoE leaves
class TinyExpertLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts[0](x)


def _moe_model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), TinyExpertLayer())


def test_moe_layers_become_zero3_leaves_only_under_stage_3() -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.utils import z3_leaf_module

    plugin = DeepSpeedPlugin(zero_stage=3, transformer_moe_cls_names="TinyExpertLayer")
    model = _moe_model()
    _mark_moe_leaves(plugin, model, {"zero_optimization": {"stage": 3}})
    assert z3_leaf_module(model[1]) and not z3_leaf_module(model[0])

    other = _moe_model()
    _mark_moe_leaves(plugin, other, {"zero_optimization": {"stage": 2}})
    assert not z3_leaf_module(other[1])
    _mark_moe_leaves(DeepSpeedPlugin(zero_stage=3), other, {"zero_optimization": {"stage": 3}})
    assert not z3_leaf_module(other[1])
    with pytest.raises(ValueError, match="TinyExpertLayer"):
        _mark_moe_leaves(
            DeepSpeedPlugin(zero_stage=3, transformer_moe_cls_names="Missing"),
            other,
            {"zero_optimization": {"stage": 3}},
        )


def test_build_engine_marks_moe_leaves_before_initialize(monkeypatch: pytest.MonkeyPatch) -> None:
    """The strategy's engine building calls the marking with the resolved config, before deepspeed.initialize."""
    pytest.importorskip("deepspeed")
    import deepspeed
    from deepspeed.utils import z3_leaf_module

    from accelerando.backends.strategies.deepspeed import strategy as ds_strategy

    seen: dict[str, bool] = {}

    class _Stop(Exception):
        pass

    def fake_initialize(**kwargs):
        seen["leaf"] = z3_leaf_module(kwargs["model"][1])
        raise _Stop

    plugin = DeepSpeedPlugin(zero_stage=3, transformer_moe_cls_names="TinyExpertLayer")
    monkeypatch.setattr(deepspeed, "initialize", fake_initialize)
    strategy = object.__new__(ds_strategy.DeepSpeedStrategy)
    strategy.runtime = type(
        "R",
        (),
        {
            "num_processes": 1,
            "mixed_precision": "no",
            "device": torch.device("cpu"),
            "device_backend": None,
            "num_nodes": 1,
            "plugins": type("P", (), {"deepspeed": {"default": plugin}})(),
        },
    )()
    strategy._batch_sizes = [2]
    strategy.auto_choice = None
    request = type("R", (), {"gradient_accumulation_steps": 1})()
    with pytest.raises(_Stop):
        strategy._build_engine(ds_strategy.Prepared(objects=[]), request, _moe_model(), None, None)
    assert seen == {"leaf": True}
