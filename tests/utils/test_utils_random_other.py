"""RNG helpers (accelerando.common.random) and small helpers (accelerando.common.other)."""

from __future__ import annotations

import functools
import pickle
import random

import numpy as np
import pytest
import torch

from accelerando.common.random import get_rng_states, set_rng_states
from accelerando.core.enums import RNGType
from accelerando.utils import (
    convert_bytes,
    extract_model_from_parallel,
    get_pretty_name,
    merge_dicts,
    set_seed,
    synchronize_rng_state,
    synchronize_rng_states,
)


def _draw() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(2).tolist()


def test_set_seed_is_reproducible_across_libraries():
    set_seed(1234)
    first = _draw()
    set_seed(1234)
    assert _draw() == first
    set_seed(4321)
    assert _draw() != first
    with pytest.raises(TypeError, match="set_seed"):
        set_seed("42")


def test_set_seed_device_specific_adds_process_index_and_deterministic_flag():
    set_seed(10, device_specific=True)  # single process: index 0
    first = _draw()
    set_seed(10)
    assert _draw() == first
    previous = torch.are_deterministic_algorithms_enabled()
    try:
        set_seed(1, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(previous)


def test_rng_states_round_trip_through_pickle():
    set_seed(7)
    states = pickle.loads(pickle.dumps(get_rng_states()))
    assert {"python", "numpy", "torch"} <= set(states)
    expected = _draw()
    _draw()
    set_rng_states(states)
    assert _draw() == expected
    with pytest.raises(TypeError):
        set_rng_states([1, 2])


def test_synchronize_accepts_all_names_in_one_process():
    generator = torch.Generator().manual_seed(3)
    synchronize_rng_states(["torch", "cuda", "numpy", "python", "xpu", "npu"])
    synchronize_rng_states([RNGType.TORCH, RNGType.GENERATOR], generator=generator)
    synchronize_rng_states()
    synchronize_rng_state()
    synchronize_rng_state("Generator", generator=generator)
    with pytest.raises(ValueError, match="Unknown RNG type"):
        synchronize_rng_states(["torch", "bogus"])
    with pytest.raises(ValueError, match="generator="):
        synchronize_rng_state("generator")


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.linear(x)


def test_extract_model_from_data_parallel_and_duck_typed_engines():
    net = _Net()
    assert extract_model_from_parallel(torch.nn.DataParallel(net)) is net

    class DeepSpeedEngine(torch.nn.Module):  # same name as deepspeed's engine, no import needed
        def __init__(self, module):
            super().__init__()
            self.module = module

    assert extract_model_from_parallel(DeepSpeedEngine(torch.nn.DataParallel(net))) is net
    assert extract_model_from_parallel(net) is net
    with pytest.raises(TypeError):
        extract_model_from_parallel("model")


def test_extract_model_removes_precision_forward_only_when_asked():
    net = _Net()
    original = net.forward
    net._accelerando_original_forward = original
    net.forward = functools.partial(lambda x: net.linear(x).half())
    assert extract_model_from_parallel(net) is net
    assert net.forward is not original and "_accelerando_original_forward" in net.__dict__
    assert extract_model_from_parallel(net, keep_fp32_wrapper=False) is net
    assert "forward" not in net.__dict__ and "_accelerando_original_forward" not in net.__dict__
    assert net(torch.ones(1, 2)).dtype == torch.float32
    pickle.dumps(net)

    def custom_forward(x):
        return x

    net._accelerando_original_forward = custom_forward
    net.forward = lambda x: None
    extract_model_from_parallel(net, keep_fp32_wrapper=False)
    assert net.forward is custom_forward


def test_extract_model_from_compiled_wrapper_without_compiling():
    net = _Net()
    compiled = torch.compile(net)  # lazy: nothing is compiled until it is called
    assert extract_model_from_parallel(compiled, keep_torch_compile=False) is net
    assert extract_model_from_parallel(compiled) is compiled
    wrapped = torch.compile(torch.nn.DataParallel(net))
    kept = extract_model_from_parallel(wrapped)
    assert type(kept).__name__ == "OptimizedModule" and kept._orig_mod is net
    assert isinstance(wrapped._orig_mod, torch.nn.DataParallel)  # the training model is untouched
    parent = torch.nn.Sequential(torch.compile(_Net()))
    extract_model_from_parallel(parent, recursive=True)
    assert isinstance(parent[0], _Net)


def test_merge_dicts_is_recursive_and_in_place():
    destination = {"a": {"x": 1, "y": 2}, "b": 1}
    source = {"a": {"y": 3, "z": {"deep": True}}, "c": 4}
    out = merge_dicts(source, destination)
    assert out is destination
    assert out == {"a": {"x": 1, "y": 3, "z": {"deep": True}}, "b": 1, "c": 4}
    assert out["a"]["z"] is not source["a"]["z"]
    with pytest.raises(TypeError):
        merge_dicts([1], {})


def test_get_pretty_name():
    assert get_pretty_name(_Net) == "_Net"
    assert get_pretty_name(_Net()) == "_Net"
    assert get_pretty_name(test_get_pretty_name) == "test_get_pretty_name"
    assert get_pretty_name(functools.partial(print)) == "partial"


def test_convert_bytes():
    assert convert_bytes(100) == "100 bytes"
    assert convert_bytes(1536) == "1.5 KB"
    assert convert_bytes(3 * 2**30) == "3.0 GB"
    assert convert_bytes(2**50 * 2) == "2.0 PB"
    with pytest.raises(ValueError):
        convert_bytes(-1)
    with pytest.raises(TypeError):
        convert_bytes("1 GB")
