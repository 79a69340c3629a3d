"""Single-process behaviour of accelerando.common.operations (collectives are identities here)."""

from __future__ import annotations

import collections
import dataclasses
import pickle
from typing import NamedTuple

import pytest
import torch

from accelerando.common.operations import TensorInformation
from accelerando.utils import (
    broadcast,
    broadcast_object_list,
    concatenate,
    convert_outputs_to_fp32,
    convert_to_fp32,
    find_batch_size,
    gather,
    gather_object,
    honor_type,
    is_tensor_information,
    listify,
    pad_across_processes,
    recursively_apply,
    reduce,
    send_to_device,
    slice_tensors,
    wait_for_everyone,
)

Point = collections.namedtuple("Point", ["x", "y"])


class Typed(NamedTuple):
    a: torch.Tensor
    b: str


class Batch(dict):
    """A dict subclass, like transformers' BatchEncoding."""


class StrictMapping(dict):
    """A dict subclass whose constructor needs an extra argument."""

    def __init__(self, data, tag):
        super().__init__(data)
        self.tag = tag


@dataclasses.dataclass
class Sample:
    inputs: torch.Tensor
    name: str


class Movable:
    def __init__(self) -> None:
        self.moved_to: list = []

    def to(self, device, non_blocking=False):
        self.moved_to.append((str(device), non_blocking))
        return self


class MovableNoKwarg:
    def __init__(self) -> None:
        self.moved_to = None

    def to(self, device):
        self.moved_to = str(device)
        return self


def test_recursively_apply_keeps_container_types():
    data = {
        "p": Point(torch.ones(2), 3),
        "t": Typed(torch.zeros(1), "s"),
        "l": [torch.ones(1), (torch.ones(2),)],
        "b": Batch(x=torch.ones(1)),
    }
    out = recursively_apply(lambda t, k: t * k, data, 3)
    assert isinstance(out["p"], Point) and out["p"].y == 3 and out["p"].x.tolist() == [3.0, 3.0]
    assert isinstance(out["t"], Typed) and out["t"].b == "s"
    assert isinstance(out["l"], list) and isinstance(out["l"][1], tuple)
    assert out["l"][1][0].tolist() == [3.0, 3.0]
    assert type(out["b"]) is Batch and out["b"]["x"].tolist() == [3.0]


def test_recursively_apply_kwargs_test_type_and_errors():
    out = recursively_apply(
        lambda v, add: v + add, [1, "a", 2.5], add=1, test_type=lambda v: isinstance(v, int)
    )
    assert out == [2, "a", 2.5]
    with pytest.raises(TypeError, match="str"):
        recursively_apply(lambda t: t, [torch.ones(1), "nope"], error_on_other_type=True)


def test_mapping_without_single_argument_constructor_is_rebuilt_by_copy():
    data = StrictMapping({"x": torch.ones(1)}, tag="keep")
    out = recursively_apply(lambda t: t + 1, data)
    assert type(out) is StrictMapping and out.tag == "keep" and out["x"].tolist() == [2.0]
    assert data["x"].tolist() == [1.0]


def test_honor_type_and_tensor_information():
    assert honor_type((1, 2), iter([3, 4])) == (3, 4)
    assert honor_type(Point(1, 2), iter([5, 6])) == Point(5, 6)
    info = TensorInformation(shape=torch.Size([2]), dtype=torch.float32)
    assert is_tensor_information(info) and not is_tensor_information(torch.ones(1))


def test_send_to_device_nested_and_non_tensors_untouched():
    movable, plain = Movable(), MovableNoKwarg()
    data = {
        "t": torch.ones(2),
        "nt": Point(torch.zeros(1), "label"),
        "list": [1, "two", None],
        "obj": movable,
        "obj2": plain,
        "sample": Sample(torch.ones(3), "s"),
    }
    out = send_to_device(data, "cpu", non_blocking=True)
    assert out["t"].device.type == "cpu"
    assert isinstance(out["nt"], Point) and out["nt"].y == "label"
    assert out["list"] == [1, "two", None]
    assert movable.moved_to == [("cpu", True)]
    assert plain.moved_to == "cpu"
    assert isinstance(out["sample"], Sample) and out["sample"].name == "s"


def test_send_to_device_skip_keys_at_any_depth():
    marker_a, marker_b = Movable(), Movable()
    data = Batch(keep=marker_a, inner={"keep": marker_b, "move": Movable()})
    out = send_to_device(data, torch.device("cpu"), skip_keys="keep")
    assert type(out) is Batch
    assert marker_a.moved_to == [] and marker_b.moved_to == []
    assert out["inner"]["move"].moved_to == [("cpu", False)]
    out = send_to_device({"a": Movable(), "b": Movable()}, "cpu", skip_keys=["a", "b"])
    assert out["a"].moved_to == [] and out["b"].moved_to == []


def test_send_to_device_uses_mapping_to_when_present():
    class WithTo(dict):
        def to(self, device, non_blocking=False):
            self["moved"] = True
            return self

    out = send_to_device(WithTo(x=torch.ones(1)), "cpu")
    assert out["moved"] is True


def test_listify_and_fp32_conversion():
    data = {
        "h": torch.ones(2, dtype=torch.float16),
        "b": torch.tensor(1.5, dtype=torch.bfloat16),
        "i": [torch.arange(2)],
    }
    assert listify(data) == {"h": [1.0, 1.0], "b": 1.5, "i": [[0, 1]]}
    out = convert_to_fp32(data)
    assert out["h"].dtype == torch.float32 and out["b"].dtype == torch.float32
    assert out["i"][0].dtype == torch.int64


def test_convert_outputs_to_fp32_wraps_and_unwraps():
    def forward(x):
        return {"logits": x.half()}

    wrapped = convert_outputs_to_fp32(forward)
    assert wrapped(torch.ones(2))["logits"].dtype == torch.float32
    assert wrapped.__wrapped__ is forward


def test_find_batch_size():
    assert find_batch_size(torch.zeros(4, 2)) == 4
    assert find_batch_size({"labels": ["a"], "x": [torch.zeros(5)]}) == 5
    assert find_batch_size(Point(torch.zeros(3), torch.zeros(7))) == 3
    for empty in ([], {}, ()):
        with pytest.raises(ValueError, match="empty"):
            find_batch_size(empty)
    with pytest.raises(TypeError):
        find_batch_size({"labels": ["a"]})
    with pytest.raises(ValueError, match="0-dimensional"):
        find_batch_size([torch.tensor(1.0)])


def test_slice_and_concatenate():
    data = {"x": torch.arange(6).view(3, 2), "y": [torch.arange(3)]}
    part = slice_tensors(data, slice(0, 2))
    assert part["x"].shape == (2, 2) and part["y"][0].tolist() == [0, 1]
    joined = concatenate([data, data])
    assert joined["x"].shape == (6, 2) and joined["y"][0].tolist() == [0, 1, 2, 0, 1, 2]
    assert concatenate([Point(torch.ones(1), torch.zeros(1))] * 2).x.shape == (2,)
    with pytest.raises(ValueError):
        concatenate([])
    with pytest.raises(TypeError):
        concatenate([["a"], ["b"]])


def test_collectives_are_identities_in_one_process():
    data = {"x": torch.arange(3), "y": (torch.tensor(1.0),)}
    assert gather(data) is data
    assert broadcast(data) is data
    padded = pad_across_processes(data)  # the reference rebuilds the containers, same tensors
    assert padded is not data and padded["x"] is data["x"] and padded["y"][0] is data["y"][0]
    with pytest.raises(TypeError):
        pad_across_processes({"n": 1})
    names = ["a", "b"]
    assert gather_object(names) is names  # in one process the object itself, as the reference
    assert gather_object({"k": 1}) == {"k": 1}
    objs = [1, 2]
    assert broadcast_object_list(objs) is objs
    assert broadcast_object_list((1, 2)) == (1, 2)
    wait_for_everyone()


def test_reduce_single_process_returns_copies():
    value = torch.tensor([2.0, 4.0])
    out = reduce({"v": value}, "mean")
    assert out["v"].tolist() == [2.0, 4.0] and out["v"] is not value
    assert reduce(value, "sum", scale=0.5).tolist() == [2.0, 4.0]  # scale acts on XLA only (reference)
    assert reduce(torch.tensor([3]), "mean").dtype == torch.int64  # a copy, as the reference
    with pytest.raises(ValueError, match="reduction"):
        reduce(value, "max")


def test_structures_survive_pickling_after_apply():
    out = recursively_apply(lambda t: t + 1, {"p": Point(torch.ones(1), 2)})
    assert pickle.loads(pickle.dumps(out))["p"].y == 2


def test_transformers_containers_keep_their_types():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_outputs import BaseModelOutput

    batch = transformers.BatchEncoding(
        {"input_ids": torch.ones(2, 3, dtype=torch.long), "mask": torch.ones(2, 3)}
    )
    moved = send_to_device(batch, "cpu", skip_keys="mask")
    assert type(moved) is transformers.BatchEncoding and moved["mask"] is batch["mask"]
    output = BaseModelOutput(last_hidden_state=torch.ones(2, 2, dtype=torch.float16))
    converted = convert_to_fp32(output)
    assert type(converted) is BaseModelOutput and converted.last_hidden_state.dtype == torch.float32
    assert concatenate([output, output]).last_hidden_state.shape == (4, 2)
