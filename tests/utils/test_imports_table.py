"""The package checks generated from accelerando.common.imports' table behave like written functions."""

from __future__ import annotations

import inspect
import pickle
import sys
import types

import pytest
import torch

from accelerando.common import imports

_GENERATED = [check.name for check in imports._PACKAGE_CHECKS]


def test_every_row_is_a_public_documented_function():
    assert len(_GENERATED) == len(set(_GENERATED))
    for name in _GENERATED:
        function = getattr(imports, name)
        assert name in imports.__all__
        assert function.__name__ == function.__qualname__ == name
        assert function.__module__ == "accelerando.common.imports"
        assert function.__doc__ and function.__doc__.startswith("Tell whether ")
        assert pickle.loads(pickle.dumps(function)) is function


@pytest.mark.parametrize(
    ("name", "parameters"),
    [
        ("is_wandb_available", "()"),
        ("is_bnb_available", "(min_version=None)"),
        ("is_numpy_available", "(min_version='1.25.0')"),
        ("is_npu_available", "(check_device=False)"),
        ("is_neuron_available", "(check_device=False)"),
        ("is_4bit_bnb_available", "()"),
    ],
)
def test_generated_signatures_match_the_reference(name, parameters):
    signature = inspect.signature(getattr(imports, name)).replace(return_annotation=inspect.Signature.empty)
    plain = signature.replace(
        parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()]
    )
    assert str(plain) == parameters


def test_generated_checks_ask_is_package_available_at_call_time(monkeypatch):
    asked: list[tuple[str, str | None]] = []

    def fake(name: str, distribution: str | None = None) -> bool:
        asked.append((name, distribution))
        return name != "tensorboard"

    monkeypatch.setattr(imports, "is_package_available", fake)
    assert imports.is_deepspeed_available() is True
    assert ("deepspeed", "deepspeed") in asked
    assert imports.is_megatron_lm_available() is True
    assert ("megatron.core", None) in asked
    # any_of: tensorboardX alone is enough
    assert imports.is_tensorboard_available() is True
    monkeypatch.setattr(imports, "is_package_available", lambda name, *a: name != "megatron.core")
    assert imports.is_megatron_lm_available() is False


def test_version_floor(monkeypatch):
    monkeypatch.setattr(imports, "is_package_available", lambda name, *a: True)
    monkeypatch.setattr(imports, "compare_versions", lambda lib, op, version: version == "0.37.2")
    assert imports.is_8bit_bnb_available() is True
    assert imports.is_4bit_bnb_available() is False
    assert imports.is_bnb_available() is True  # no floor: the version is not asked
    assert imports.is_bnb_available("0.39.0") is False


def test_device_extension_imported_only_when_a_device_is_asked(monkeypatch):
    imported: list[str] = []
    fake_extension = types.ModuleType("torch_mlu")
    monkeypatch.setitem(sys.modules, "torch_mlu", fake_extension)
    monkeypatch.setattr(imports, "is_package_available", lambda name, *a: name == "torch_mlu")
    real_import = imports.importlib.import_module
    monkeypatch.setattr(
        imports.importlib, "import_module", lambda name: imported.append(name) or real_import(name)
    )
    assert imports.is_mlu_available() is True
    assert imported == []
    monkeypatch.setattr(torch, "mlu", types.SimpleNamespace(is_available=lambda: True), raising=False)
    assert imports.is_mlu_available(check_device=True) is True
    assert imported == ["torch_mlu"]

    def broken() -> bool:
        raise RuntimeError("driver missing")

    monkeypatch.setattr(torch, "mlu", types.SimpleNamespace(is_available=broken), raising=False)
    assert imports.is_mlu_available(check_device=True) is False
    assert imports.is_musa_available(check_device=True) is False  # not installed: nothing imported


def test_derived_checks_see_monkeypatched_generated_ones(monkeypatch):
    monkeypatch.setattr(imports, "is_msamp_available", lambda: False)
    monkeypatch.setattr(imports, "is_transformer_engine_available", lambda: False)
    monkeypatch.setattr(imports, "is_torchao_available", lambda: True)
    assert imports.is_fp8_available() is True
    monkeypatch.setattr(imports, "is_bnb_available", lambda *a: False)
    assert imports.is_bitsandbytes_multi_backend_available() is False
