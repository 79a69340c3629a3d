"""FP8 through torchao on CPU (emulated): the Accelerator trains exactly as torchao by hand, stays
close to bf16, resumes exactly from a checkpoint, and saves high-precision weights."""

from __future__ import annotations

import logging

import pytest
import torch

from suite_support import reset_accelerator_state

pytest.importorskip("torchao")

from _fp8_common import batches, by_hand, loss_of, make_model, train  # noqa: E402

STEPS = 10


def _fresh(**kwargs):
    from accelerando import Accelerator

    reset_accelerator_state()
    return Accelerator(**kwargs)


def _accelerated(steps: int, **kwargs) -> tuple[list[float], object, object]:
    acc = _fresh(**kwargs)
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    return train(model, opt, batches(steps), 0, steps, acc.backward), acc, model


def test_accelerator_equals_torchao_by_hand_bitwise_and_stays_near_bf16(fresh_state, caplog):
    from accelerando.plugins.kwargs import AORecipeKwargs

    with caplog.at_level(logging.INFO):
        fp8, acc, model = _accelerated(STEPS, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
    assert "emulation on cpu" in caplog.text and "torchao" in caplog.text
    assert str(acc._precision.fp8_backend) == "AO"
    kinds = {name: type(m).__name__ for name, m in model.named_modules() if "Linear" in type(m).__name__}
    assert kinds["proj"] == "Linear" and kinds["head"] == "Linear"  # first and last kept
    assert kinds["blocks.0.q"] == "Float8Linear" and kinds["blocks.1.down"] == "Float8Linear"

    hand = by_hand(make_model())
    opt = torch.optim.AdamW(hand.parameters(), lr=1e-2)
    manual = train(hand, opt, batches(STEPS), 0, STEPS)
    assert fp8 == manual  # bitwise: same conversion, same config, same order of operations

    bf16, _, _ = _accelerated(STEPS, mixed_precision="bf16")
    fp32, _, _ = _accelerated(STEPS, mixed_precision="no")
    # Float8 rounding (3 mantissa bits for e4m3) moves the loss by at most 0.25% over these 10 steps.
    for a, b, c in zip(fp8, bf16, fp32, strict=True):
        assert abs(a - b) / b < 0.01 and abs(a - c) / c < 0.01
    assert fp8 != fp32  # the FP8 rounding really happens


def test_save_state_load_state_continue_equals_uninterrupted(fresh_state, tmp_path):
    from accelerando.plugins.kwargs import AORecipeKwargs

    full, _, _ = _accelerated(STEPS, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])

    acc = _fresh(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    data = batches(STEPS)
    first = train(model, opt, data, 0, STEPS // 2, acc.backward)
    acc.save_state(tmp_path / "ckpt")

    acc = _fresh(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
    model = make_model(seed=123)  # other weights: everything must come from the checkpoint
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    acc.load_state(tmp_path / "ckpt")
    rest = train(model, opt, data, STEPS // 2, STEPS - STEPS // 2, acc.backward)
    assert first + rest == full


def test_save_model_writes_high_precision_weights_loadable_without_torchao(fresh_state, tmp_path):
    from safetensors.torch import load_file

    from accelerando.backends.precision.fp8.torchao import has_ao_layers

    _, acc, model = _accelerated(3, mixed_precision="fp8")
    assert has_ao_layers(model)
    acc.save_model(model, tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in weights.values())
    plain = make_model(seed=5)
    plain.load_state_dict(weights)  # same keys as the unconverted model
    expected = acc.unwrap_model(model).state_dict()
    assert all(torch.equal(plain.state_dict()[k], expected[k]) for k in weights)
    ids = batches(1)[0]
    with torch.no_grad():
        assert abs(loss_of(plain, ids).item() - loss_of(model, ids).item()) < 0.05


def test_filters_and_user_filter(fresh_state):
    from torchao.float8 import Float8LinearConfig

    from accelerando.backends.precision.fp8 import torchao as ao
    from accelerando.plugins.kwargs import AORecipeKwargs

    model = make_model()
    assert ao.find_first_last_linear_layers(model) == ("proj", "head")
    assert ao.find_first_last_linear_layers(torch.nn.ReLU()) == (None, None)
    odd = torch.nn.Linear(24, 32)
    assert not ao.filter_linear_layers(odd, "x", [])  # 24 is not divisible by 16
    assert ao.filter_linear_layers(torch.nn.Linear(32, 48), "x", []) and not ao.filter_linear_layers(
        torch.nn.Linear(32, 48), "x", ["x"]
    )
    assert not ao.filter_linear_layers(torch.nn.ReLU(), "x", [])
    assert not ao.has_ao_layers(model)
    ao.convert_model_to_fp8_ao(model, config=Float8LinearConfig(emulate=True))
    converted = {n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"}
    assert "proj" not in converted and "head" not in converted and len(converted) == 12
    assert ao.has_ao_layers(model)
    with pytest.raises(TypeError, match="Float8LinearConfig"):
        ao.convert_model_to_fp8_ao(make_model(), config={"emulate": True})

    only_mlp = AORecipeKwargs(module_filter_func=lambda module, fqn: fqn.endswith(("up", "down")))
    _, _, prepared = _accelerated(1, mixed_precision="fp8", kwargs_handlers=[only_mlp])
    converted = {n for n, m in prepared.named_modules() if type(m).__name__ == "Float8Linear"}
    assert converted == {"blocks.0.up", "blocks.0.down", "blocks.1.up", "blocks.1.down"}
