"""Hooks: attach/remove restores forward exactly; nesting and appending run in order; device hooks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accelerando.hooks import (
    AlignDevicesHook,
    LayerwiseCastingHook,
    ModelHook,
    SequentialHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
    attach_layerwise_casting_hooks,
    remove_hook_from_module,
    remove_hook_from_submodules,
)
from accelerando.utils.modeling import align_module_device, has_offloaded_params


class SeeingLinear(nn.Linear):
    """A Linear that records where and in which dtype its weight is while its forward runs."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[str, torch.dtype]] = []

    def forward(self, x):
        self.seen.append((self.weight.device.type, self.weight.dtype))
        return super().forward(x)


class Recorder(ModelHook):
    def __init__(self, tag: str, log: list[str]) -> None:
        self.tag = tag
        self.log = log

    def pre_forward(self, module, *args, **kwargs):
        self.log.append(f"pre-{self.tag}")
        return args, kwargs

    def post_forward(self, module, output):
        self.log.append(f"post-{self.tag}")
        return output


class AddOne(ModelHook):
    def pre_forward(self, module, x):
        return (x + 1,), {}


class Double(ModelHook):
    def post_forward(self, module, output):
        return output * 2


def test_remove_restores_original_forward():
    model = nn.Linear(3, 3)
    assert "forward" not in model.__dict__
    add_hook_to_module(model, AddOne())
    assert hasattr(model, "_hf_hook") and hasattr(model, "_old_forward")
    x = torch.ones(2, 3)
    torch.testing.assert_close(model(x), nn.functional.linear(x + 1, model.weight, model.bias))
    remove_hook_from_module(model)
    assert "forward" not in model.__dict__ and not hasattr(model, "_hf_hook")
    assert model.forward.__func__ is nn.Linear.forward
    torch.testing.assert_close(model(x), nn.functional.linear(x, model.weight, model.bias))


def test_instance_level_forward_is_put_back():
    model = nn.Linear(3, 3)

    def custom(x):
        return x * 0

    model.forward = custom
    add_hook_to_module(model, AddOne())
    remove_hook_from_module(model)
    assert model.forward is custom


def test_appended_hooks_run_in_order_and_replace_without_append():
    log: list[str] = []
    model = nn.Linear(2, 2)
    add_hook_to_module(model, Recorder("a", log))
    add_hook_to_module(model, Recorder("b", log), append=True)
    add_hook_to_module(model, Recorder("c", log), append=True)
    assert isinstance(model._hf_hook, SequentialHook) and len(model._hf_hook.hooks) == 3
    model(torch.ones(1, 2))
    assert log == ["pre-a", "pre-b", "pre-c", "post-a", "post-b", "post-c"]
    log.clear()
    add_hook_to_module(model, Recorder("d", log))
    model(torch.ones(1, 2))
    assert log == ["pre-d", "post-d"]


def test_nested_hooks_on_parent_and_child_run_outside_in():
    log: list[str] = []
    child = nn.Linear(2, 2)
    parent = nn.Sequential(child)
    add_hook_to_module(parent, Recorder("parent", log))
    add_hook_to_module(child, Recorder("child", log))
    parent(torch.ones(1, 2))
    assert log == ["pre-parent", "pre-child", "post-child", "post-parent"]
    remove_hook_from_submodules(parent)
    assert not hasattr(parent, "_hf_hook") and not hasattr(child, "_hf_hook")
    seq = SequentialHook(AddOne(), Double())
    add_hook_to_module(child, seq)
    x = torch.ones(1, 2)
    torch.testing.assert_close(child(x), 2 * nn.functional.linear(x + 1, child.weight, child.bias))


def test_offloading_hook_loads_weights_only_during_forward_and_restores_on_detach():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), SeeingLinear(4, 2))
    model.register_buffer("shift", torch.ones(2), persistent=True)
    x = torch.randn(3, 4)
    expected = model(x)
    attach_align_device_hook(model, execution_device="cpu", offload=True)
    assert model[0].weight.device.type == "meta"
    assert has_offloaded_params(model[0]) and not has_offloaded_params(model[1])
    model[2].seen.clear()
    torch.testing.assert_close(model(x), expected)
    assert model[2].seen == [("cpu", torch.float32)] and model[2].weight.device.type == "meta"
    with align_module_device(model[0]):
        assert model[0].weight.device.type == "cpu"
    assert model[0].weight.device.type == "meta"
    remove_hook_from_submodules(model)
    assert all(p.device.type == "cpu" for p in model.parameters())
    torch.testing.assert_close(model(x), expected)


def test_io_same_device_and_skip_keys():
    hook = AlignDevicesHook(execution_device="meta", io_same_device=True, skip_keys="keep")
    module = nn.Identity()
    args, kwargs = hook.pre_forward(module, torch.ones(2), keep=torch.ones(1), other={"t": torch.ones(1)})
    assert args[0].device.type == "meta" and kwargs["other"]["t"].device.type == "meta"
    assert kwargs["keep"].device.type == "cpu"
    assert hook.input_device == torch.device("cpu")
    back = AlignDevicesHook(io_same_device=True)
    back.pre_forward(module, torch.ones(2, device="meta"))
    assert back.post_forward(module, [torch.ones(1)])[0].device.type == "meta"


def test_execution_and_block_hooks_on_cpu():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2)))
    attach_execution_device_hook(model, "cpu")
    assert isinstance(model[0]._hf_hook, AlignDevicesHook) and isinstance(
        model[1][0]._hf_hook, AlignDevicesHook
    )
    remove_hook_from_submodules(model)
    x = torch.ones(1, 2)
    expected = model(x)
    attach_align_device_hook_on_blocks(model, {"0": "cpu", "1": "cpu"}, {"0": False, "1": True})
    assert model[1][0].weight.device.type == "meta" and model[0].weight.device.type == "cpu"
    torch.testing.assert_close(model(x), expected)


def test_layerwise_casting_stores_low_and_computes_high():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), SeeingLinear(4, 4))
    attach_layerwise_casting_hooks(model, torch.bfloat16, torch.float32, skip_modules_pattern=[r"^1$"])
    assert model[0].weight.dtype == torch.bfloat16 and model[1].weight.dtype == torch.float32
    out = model(torch.randn(2, 4))
    assert out.dtype == torch.float32 and model[2].seen == [("cpu", torch.float32)]
    assert model[2].weight.dtype == torch.bfloat16
    assert isinstance(model[0]._hf_hook, LayerwiseCastingHook)
    with pytest.raises(TypeError, match="torch dtypes"):
        attach_layerwise_casting_hooks(model, "bf16", torch.float32)


def test_layerwise_casting_hooks_only_linear_and_conv_layers_and_skips_subtrees():
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(2, 2)
            self.norm = nn.LayerNorm(2)
            self.conv = nn.Conv1d(2, 2, 1)
            self.inner = nn.Sequential(nn.Linear(2, 2))

    def hooked(model: nn.Module) -> list[str]:
        return [name for name, module in model.named_modules() if hasattr(module, "_hf_hook")]

    model = nn.Sequential(Block(), nn.Embedding(3, 2), nn.Linear(2, 2))
    attach_layerwise_casting_hooks(model, torch.float16, torch.float32)
    # norms and embeddings keep their dtype; only linear and convolution layers are cast
    assert hooked(model) == ["0.proj", "0.conv", "0.inner.0", "2"]
    assert model[0].norm.weight.dtype == torch.float32 and model[1].weight.dtype == torch.float32
    model = nn.Sequential(Block(), nn.Linear(2, 2))
    attach_layerwise_casting_hooks(model, torch.float16, torch.float32, skip_modules_pattern=[r"^0$"])
    assert hooked(model) == ["1"]  # a matching module is skipped with everything under it
    model = nn.Sequential(Block(), nn.Linear(2, 2))
    attach_layerwise_casting_hooks(model, torch.float16, torch.float32, skip_modules_classes=(nn.Sequential,))
    assert hooked(model) == []  # the root itself is checked
    model = nn.Sequential(Block(), nn.Linear(2, 2))
    with pytest.warns(UserWarning, match="each of its characters"):
        # a string is iterated as in the reference: "^" matches every name
        attach_layerwise_casting_hooks(model, torch.float16, torch.float32, skip_modules_pattern=r"^1$")
    assert hooked(model) == []


def test_disk_offload_prefetches_the_next_module(tmp_path, monkeypatch):
    import threading

    from accelerando.big_modeling import disk_offload

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(3)])
    x = torch.randn(2, 4)
    expected = model(x)
    disk_offload(model, tmp_path, execution_device="cpu")
    hooks = [layer._hf_hook for layer in model]
    assert hooks[0].next_hook is hooks[1] and hooks[1].next_hook is hooks[2] and hooks[2].next_hook is None
    threads: list[str] = []
    original = AlignDevicesHook._load

    def recording(self):
        threads.append(threading.current_thread().name)
        return original(self)

    monkeypatch.setattr(AlignDevicesHook, "_load", recording)
    torch.testing.assert_close(model(x), expected)
    assert len(threads) == 2 and all(name.startswith("accelerando-prefetch") for name in threads)
    assert all(hook._prefetched is None for hook in hooks)


def test_dispatch_model_root_hook_runs_on_the_main_device(tmp_path):
    from accelerando.big_modeling import dispatch_model

    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    x = torch.randn(1, 2)
    expected = model(x)
    dispatch_model(model, {"0": "cpu", "1": "disk"}, offload_dir=tmp_path)
    root = model._hf_hook
    # As in the reference: one root hook, moving inputs to the main device and outputs back.
    assert isinstance(root, AlignDevicesHook) and root.io_same_device and not root.offload
    assert str(root.execution_device) == "cpu"
    torch.testing.assert_close(model(x), expected)
