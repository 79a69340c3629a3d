"""Device maps, budgets and sizes: guarantees of infer_auto_device_map and the memory helpers."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

import accelerando.big_modeling.device_map as device_map_module
from accelerando.big_modeling import init_empty_weights
from accelerando.utils.modeling import (
    calculate_maximum_sizes,
    check_tied_parameters_on_same_device,
    compute_module_sizes,
    compute_module_total_buffer_size,
    find_tied_parameters,
    get_balanced_memory,
    get_max_layer_size,
    get_max_memory,
    infer_auto_device_map,
)


class Block(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.attn = nn.Linear(width, width)
        self.mlp = nn.Linear(width, width)

    def forward(self, x):
        return self.mlp(self.attn(x))


class Tiny(nn.Module):
    def __init__(self, blocks: int = 6, width: int = 16, tie: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(blocks)])
        self.head = nn.Linear(width, 64, bias=False)
        if tie:
            self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(width))


def _devices_of(model: nn.Module, device_map: dict) -> dict[str, object]:
    placed = {}
    for name, _ in model.named_parameters(remove_duplicate=False):
        probe = name
        while probe not in device_map:
            probe = probe.rpartition(".")[0]
        placed[name] = device_map[probe]
    return placed


def _usage(model, device_map, sizes):
    usage: dict[object, int] = {}
    for name, device in device_map.items():
        usage[device] = usage.get(device, 0) + sizes[name]
    return usage


def test_sizes_count_tied_weights_once_and_respect_dtype():
    model = Tiny()
    sizes = compute_module_sizes(model)
    assert sizes["embed"] == 64 * 16 * 4
    assert sizes["head"] == 0  # tied to embed: counted under its first name
    assert sizes[""] == sum(p.numel() * 4 for p in model.parameters()) + 16 * 4
    half = compute_module_sizes(model, dtype=torch.float16)
    assert half[""] == sizes[""] // 2
    special = compute_module_sizes(model, dtype="float16", special_dtypes={"embed.weight": torch.float32})
    assert special["embed"] == sizes["embed"]
    assert compute_module_total_buffer_size(model) == 16 * 4
    assert compute_module_sizes(model, buffers_only=True)[""] == 16 * 4
    total, (largest, names) = calculate_maximum_sizes(model)
    assert total == sizes[""] and largest == sizes["embed"] and names == ["embed"]
    assert get_max_layer_size(list(model.named_children()), sizes, ["Block"]) == (sizes["embed"], ["embed"])


@pytest.mark.parametrize(
    "value, expected",
    [
        (1000, 1000),
        ("10GB", 10 * 10**9),
        ("10GiB", 10 * 2**30),
        ("500MB", 500 * 10**6),
        ("1.5kib", 1536),
        ("7", 7),
    ],
)
def test_max_memory_string_forms(value, expected):
    assert get_max_memory({"cpu": value})["cpu"] == expected


def test_max_memory_device_keys_are_normalised_and_ordered():
    budget = get_max_memory({"disk": 1, "cpu": 2, "mps": 3, "xpu:0": 4, "cuda:1": 5, "0": 6})
    assert list(budget) == [0, 1, "xpu:0", "mps", "cpu", "disk"]
    assert budget[0] == 6 and budget[1] == 5


@pytest.mark.parametrize("bad", ["ten GB", "10XB", "", "GB"])
def test_bad_size_string_names_the_fix(bad):
    with pytest.raises(ValueError, match="GiB"):
        get_max_memory({"cpu": bad})


def test_unknown_device_is_rejected():
    with pytest.raises(ValueError, match="Unknown device"):
        get_max_memory({"tpu0": "1GB"})
    with pytest.raises(TypeError):
        get_max_memory(["cpu"])


def test_free_memory_is_read_when_no_budget_given():
    budget = get_max_memory()
    assert budget["cpu"] > 0


def test_everything_fits_gives_single_entry():
    model = Tiny()
    assert infer_auto_device_map(model, {"cpu": "1GB"}) == {"": "cpu"}


def test_no_split_classes_budgets_and_tied_parameters():
    with init_empty_weights():
        model = Tiny(blocks=8, width=32)
    sizes = compute_module_sizes(model)
    block = sizes["blocks.0"]
    budget = {0: 3 * block, 1: 3 * block, "cpu": 2 * block, "disk": "1GB"}
    device_map = infer_auto_device_map(model, budget, no_split_module_classes=["Block"], clean_result=False)
    # No Block is split: every block appears whole or not at all as a key prefix.
    for name in device_map:
        assert not any(name.startswith(f"blocks.{i}.") for i in range(8)), name
    placed = _devices_of(model, device_map)
    assert placed["embed.weight"] == placed["head.weight"]
    assert check_tied_parameters_on_same_device(find_tied_parameters(model), device_map)
    usage = _usage(model, device_map, sizes)
    for device, limit in get_max_memory(budget).items():
        assert usage.get(device, 0) <= limit, (device, usage)
    assert set(device_map.values()) >= {0, 1, "cpu", "disk"}


def test_main_device_keeps_room_for_the_largest_offloaded_layer():
    model = Tiny(blocks=6, width=32, tie=False)
    sizes = compute_module_sizes(model)
    largest, _ = get_max_layer_size(list(model.named_children()), sizes, ["Block"])
    budget = {"cpu": sizes[""] // 2, "disk": "1GB"}
    device_map = infer_auto_device_map(model, budget, no_split_module_classes=["Block"], clean_result=False)
    assert "disk" in device_map.values()
    cpu_used = _usage(model, device_map, sizes).get("cpu", 0)
    assert cpu_used + largest <= budget["cpu"]
    # As in the reference, offload_buffers changes no placement (only the warning about buffers).
    loose = infer_auto_device_map(model, budget, ["Block"], offload_buffers=True, clean_result=False)
    assert loose == device_map


def test_verbose_explains_decisions(capsys):
    model = Tiny(blocks=4)
    infer_auto_device_map(model, {"cpu": 3000, "disk": "1GB"}, ["Block"], verbose=True)
    out = capsys.readouterr().out
    assert "Treating module" in out and "Putting" in out and "going to the next device" in out


def test_fallback_allocation_fills_an_otherwise_empty_device():
    inner = nn.Sequential(nn.Linear(10, 4), nn.Linear(4, 4), nn.Linear(4, 8))
    model = nn.Sequential(OrderedDict([("module", inner)]))
    # Device 0 keeps room for the largest layer (176 bytes): the first layer does not fit beside it.
    assert infer_auto_device_map(model, {0: 256}) == {"": "disk"}
    placed = infer_auto_device_map(model, {0: 256}, fallback_allocation=True)
    assert placed == {"module.0": "disk", "module.1": 0, "module.2": "disk"}


def test_balanced_memory_spreads_and_accepts_both_low_zero_names():
    model = Tiny(blocks=8, width=32, tie=False)
    total = compute_module_sizes(model)[""]
    budget = {0: "1GB", 1: "1GB", 2: "1GB", "cpu": "1GB"}
    balanced = get_balanced_memory(model, budget, ["Block"])
    assert balanced[0] < total and balanced[1] < total and balanced[2] == 10**9
    low = get_balanced_memory(model, budget, ["Block"], low_zero=True)
    assert low[0] < balanced[0]
    assert get_balanced_memory(model, budget, ["Block"], low_zero_memory=True) == low
    assert get_balanced_memory(model, {0: "1GB", "cpu": "1GB"}) == get_max_memory({0: "1GB", "cpu": "1GB"})


def _counting_scan(counter: list[int]):
    real = device_map_module._scan

    class CountingSizes(dict):
        def get(self, key, default=None):
            counter[0] += 1
            return super().get(key, default)

        def __getitem__(self, key):
            counter[0] += 1
            return super().__getitem__(key)

    def scan(*args, **kwargs):
        result = real(*args, **kwargs)
        result.sizes = CountingSizes(result.sizes)
        return result

    return scan


class Leaf(nn.Module):
    """A 1,088-byte leaf that is cheap to build (no initialisation), to keep 21,000 of them fast."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(272, device="meta"))


@pytest.fixture(scope="module")
def flat_models():
    return {count: nn.Sequential(*[Leaf() for _ in range(count)]) for count in (1000, 4000, 16000)}


@pytest.mark.parametrize("fits", [True, False])
def test_device_map_work_grows_linearly(monkeypatch, flat_models, fits):
    lookups = {}
    for count, model in flat_models.items():
        counter = [0]
        monkeypatch.setattr(device_map_module, "_scan", _counting_scan(counter))
        # Either everything fits, or the model is split across cpu and disk (every module is visited).
        budget = {"cpu": "1GB"} if fits else {"cpu": count * 1088 // 2, "disk": "1GB"}
        device_map = infer_auto_device_map(model, budget)
        assert fits or set(device_map.values()) == {"cpu", "disk"}
        lookups[count] = counter[0]
    assert lookups[1000] > 0
    assert lookups[16000] <= 16.5 * lookups[1000]
    assert lookups[4000] <= 4.2 * lookups[1000]
