"""Random small models and budgets for comparing device maps with the reference, one case per seed.

Run as a script in an interpreter where ``accelerate`` is either the reference or accelerando; it
prints one JSON line per case with what the big-model helpers answer, so two interpreters' outputs
can be compared line by line::

    python device_map_parity_cases.py accelerate 0 200
"""

from __future__ import annotations

import importlib
import json
import random
import sys
import warnings

import torch
from torch import nn


class Block(nn.Module):
    """A container class that cases may list in ``no_split_module_classes``."""


class Attention(nn.Module):
    """Another container class, with its own parameters or buffers beside children."""


class Holder(nn.Module):
    """A module holding only its own tensors (a leaf unless given children)."""


_CONTAINERS = (Block, Attention, nn.Sequential, nn.ModuleList)


def _leaf(rng: random.Random) -> nn.Module:
    kind = rng.randrange(6)
    width = rng.choice([2, 3, 4, 6, 8])
    if kind == 0:
        return nn.Linear(width, rng.choice([2, 4, 5]), bias=rng.random() < 0.8)
    if kind == 1:
        return nn.LayerNorm(width)
    if kind == 2:
        return nn.BatchNorm1d(width)
    if kind == 3:
        return nn.Embedding(rng.choice([3, 5, 10]), width)
    if kind == 4:
        return nn.ReLU()
    holder = Holder()
    holder.weight = nn.Parameter(torch.zeros(rng.choice([1, 4, 9, 16])))
    if rng.random() < 0.5:
        dtype = rng.choice([torch.float32, torch.int64, torch.bool, torch.float16])
        holder.register_buffer("state", torch.zeros(rng.choice([3, 8, 16]), dtype=dtype),
                               persistent=rng.random() < 0.7)  # fmt: skip
    return holder


def _tree(rng: random.Random, depth: int) -> nn.Module:
    if depth <= 0 or rng.random() < 0.3:
        return _leaf(rng)
    container = rng.choice(_CONTAINERS)
    children = [_tree(rng, depth - 1) for _ in range(rng.randint(1, 4))]
    if container is nn.Sequential:
        return nn.Sequential(*children)
    if container is nn.ModuleList:
        return nn.ModuleList(children)
    module = container()
    for index, child in enumerate(children):
        module.add_module(f"c{index}", child)
    if rng.random() < 0.4:
        module.scale = nn.Parameter(torch.ones(rng.choice([2, 5, 12])))
    if rng.random() < 0.3:
        module.register_buffer("steps", torch.zeros(rng.choice([1, 4])))
    return module


def _tie(rng: random.Random, model: nn.Module) -> None:
    """Tie a few parameters of equal shape (as ``lm_head.weight = embed.weight`` does)."""
    by_shape: dict[tuple, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                by_shape.setdefault((tuple(param.shape), param.dtype), []).append((module, name))
    candidates = [owners for owners in by_shape.values() if len(owners) > 1]
    for _ in range(rng.randint(0, 2)):
        if not candidates:
            return
        owners = rng.choice(candidates)
        (first, first_name), (second, second_name) = rng.sample(owners, 2)
        setattr(second, second_name, getattr(first, first_name))


def build_case(seed: int) -> tuple[nn.Module, dict]:
    """The model and the ``infer_auto_device_map`` keyword arguments of case ``seed``."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = _tree(rng, rng.randint(1, 4))
    if not list(model.children()):
        model = nn.Sequential(model, _leaf(rng))
    if rng.random() < 0.5:
        _tie(rng, model)
    if rng.random() < 0.2:
        model.register_buffer("root_buffer", torch.zeros(rng.choice([2, 6])))
    total = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )
    devices = rng.choice([[0], [0, 1], [0, 1, 2], ["cpu"], [0, "cpu"], [0, 1, "cpu"], [0, "cpu", "disk"]])
    max_memory = {
        device: int(total * rng.choice([0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5])) for device in devices
    }
    kwargs = {
        "max_memory": max_memory,
        "no_split_module_classes": rng.choice([None, ["Block"], ["Attention", "Block"], ["Holder"], "Block"]),
        "dtype": rng.choice([None, None, torch.float16, "float16"]),
        "offload_buffers": rng.random() < 0.3,
        "fallback_allocation": rng.random() < 0.3,
        "clean_result": rng.random() < 0.8,
    }
    return model, kwargs


def _answer(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = call()
        except Exception as error:  # noqa: BLE001 - the exception type is part of the answer
            return {"raised": type(error).__name__}
    value = {
        str(key): (value[key] if isinstance(value[key], (int, str)) else str(value[key])) for key in value
    }
    buffer_warning = any("bytes of buffer" in str(w.message) for w in caught)
    return {"value": value, "buffer_warning": buffer_warning}


def run_case(library: str, seed: int) -> dict:
    """Everything the helpers answer for case ``seed`` with ``library`` (``accelerate`` or ``accelerando``)."""
    modeling = importlib.import_module(f"{library}.utils.modeling")
    model, kwargs = build_case(seed)
    answers = {"seed": seed}
    answers["sizes"] = _answer(lambda: modeling.compute_module_sizes(model, dtype=kwargs["dtype"]))
    answers["map"] = _answer(lambda: modeling.infer_auto_device_map(model, **kwargs))
    balanced_args = dict(
        max_memory=kwargs["max_memory"], no_split_module_classes=kwargs["no_split_module_classes"]
    )
    no_split = kwargs["no_split_module_classes"]
    no_split = [no_split] if isinstance(no_split, str) else no_split
    answers["max_layer"] = _answer(
        lambda: dict(
            enumerate(
                modeling.get_max_layer_size(
                    list(model.named_children()), modeling.compute_module_sizes(model), no_split
                )
            )  # fmt: skip
        )
    )
    answers["maximum_sizes"] = _answer(lambda: dict(enumerate(modeling.calculate_maximum_sizes(model))))
    answers["balanced"] = _answer(lambda: modeling.get_balanced_memory(model, **balanced_args))
    answers["balanced_low_zero"] = _answer(
        lambda: modeling.get_balanced_memory(model, low_zero=True, **balanced_args)
    )
    return answers


def main(argv: list[str]) -> None:
    library, first, last = argv[0], int(argv[1]), int(argv[2])
    import logging

    logging.disable(logging.CRITICAL)
    for seed in range(first, last):
        print(json.dumps(run_case(library, seed), sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
