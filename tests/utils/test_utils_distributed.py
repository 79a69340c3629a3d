"""Collective utilities in two real processes (gloo on CPU), all checked in one launch.

Starting processes costs seconds, so one function per rank runs every check and returns a dict of
observations; the test then asserts on both ranks' observations.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest

from suite_support import run_distributed_preloaded

Pair = collections.namedtuple("Pair", ["first", "second"])


def _collectives_per_rank() -> dict[str, Any]:
    import random

    import numpy as np
    import torch

    from accelerando.common.operations import wait_for_everyone
    from accelerando.state import PartialState
    from accelerando.utils import (
        broadcast,
        broadcast_object_list,
        gather,
        gather_object,
        pad_across_processes,
        reduce,
        synchronize_rng_states,
    )

    state = PartialState()
    rank = state.process_index
    seen: dict[str, Any] = {
        "rank": rank,
        "world": state.num_processes,
        "use_distributed": state.use_distributed,
    }

    # gather: nested structure, 0-d tensor, non-contiguous tensor.
    nested = {
        "a": torch.tensor([rank, rank + 10]),
        "b": Pair(torch.tensor(float(rank)), torch.arange(6).view(2, 3).t() + rank),
    }
    out = gather(nested)
    seen["gather_a"] = out["a"].tolist()
    seen["gather_b_first"] = out["b"].first.tolist()
    seen["gather_b_second_shape"] = tuple(out["b"].second.shape)
    seen["gather_b_second_type"] = type(out["b"]).__name__
    seen["gather_b_second"] = out["b"].second.tolist()

    # gather of different sizes: a clear error on every rank, and the group stays usable afterwards.
    try:
        gather(torch.zeros(rank + 1))
        seen["mismatch_error"] = None
    except ValueError as err:
        seen["mismatch_error"] = str(err)

    seen["gather_object_list"] = gather_object([f"r{rank}", rank])
    seen["gather_object_plain"] = gather_object({"rank": rank})
    seen["gather_object_rows"] = gather_object(torch.tensor([rank, 10 + rank]))
    seen["gather_object_scalar"] = gather_object(rank)
    seen["broadcast_object_list_empty"] = broadcast_object_list([], from_process=1)

    tensor = torch.full((3,), float(rank)) + torch.arange(3.0)
    seen["broadcast"] = broadcast({"t": tensor.clone()}, from_process=1)["t"].tolist()
    non_contiguous = torch.arange(6.0).view(2, 3).t().contiguous().t() * (rank + 1)
    broadcast(non_contiguous, from_process=0)
    seen["broadcast_noncontig"] = non_contiguous.tolist()

    objects = [{"from": rank}, f"text{rank}"]
    broadcast_object_list(objects, from_process=0)
    seen["broadcast_objects"] = objects

    value = torch.tensor([1.0, 2.0]) * (rank + 1)
    seen["reduce_mean"] = reduce(value, "mean").tolist()
    seen["reduce_sum"] = reduce([value], "sum")[0].tolist()
    seen["reduce_scale"] = reduce(value, "sum", scale=2.0).tolist()
    seen["reduce_input_untouched"] = value.tolist()

    ragged = torch.ones(rank + 1, 2, dtype=torch.long) * (rank + 1)
    padded_end = pad_across_processes(ragged, dim=0, pad_index=-1)
    padded_first = pad_across_processes({"x": ragged}, dim=0, pad_index=-1, pad_first=True)["x"]
    seen["pad_end"] = padded_end.tolist()
    seen["pad_first"] = padded_first.tolist()
    seen["pad_then_gather"] = gather(padded_end).tolist()

    # RNG sync: different seeds per rank, then rank 0's state everywhere.
    torch.manual_seed(100 + rank)
    np.random.seed(100 + rank)
    random.seed(100 + rank)
    generator = torch.Generator().manual_seed(7 + rank)
    synchronize_rng_states(["torch", "cuda", "numpy", "python", "generator"], generator=generator)
    seen["rng"] = (
        torch.rand(3).tolist(),
        float(np.random.rand()),
        random.random(),
        torch.rand(2, generator=generator).tolist(),
    )
    wait_for_everyone()
    return seen


@pytest.fixture(scope="module")
def observations() -> list[dict[str, Any]]:
    return run_distributed_preloaded(_collectives_per_rank, 2)


def test_two_processes_are_distributed(observations):
    assert [o["rank"] for o in observations] == [0, 1]
    assert all(o["world"] == 2 and o["use_distributed"] for o in observations)


def test_gather_nested_0d_and_non_contiguous(observations):
    for seen in observations:
        assert seen["gather_a"] == [0, 10, 1, 11]
        assert seen["gather_b_first"] == [0.0, 1.0]
        assert seen["gather_b_second_type"] == "Pair"
        assert seen["gather_b_second_shape"] == (6, 2)
        assert seen["gather_b_second"] == [[0, 3], [1, 4], [2, 5], [1, 4], [2, 5], [3, 6]]


def test_gather_of_mismatched_shapes_names_the_fix(observations):
    for seen in observations:
        assert seen["mismatch_error"] is not None
        assert "pad_across_processes" in seen["mismatch_error"]
        assert "process 1" in seen["mismatch_error"]


def test_gather_object(observations):
    for seen in observations:
        assert seen["gather_object_list"] == ["r0", 0, "r1", 1]
        # As the reference: each process's object is iterated (a dict gives its keys, a tensor
        # its rows); one that cannot be iterated contributes itself (the reference raises there).
        assert seen["gather_object_plain"] == ["rank", "rank"]
        assert [int(t) for t in seen["gather_object_rows"]] == [0, 10, 1, 11]
        assert seen["gather_object_scalar"] == [0, 1]


def test_broadcast_and_broadcast_object_list(observations):
    for seen in observations:
        assert seen["broadcast"] == [1.0, 2.0, 3.0]
        assert seen["broadcast_noncontig"] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
        assert seen["broadcast_objects"] == [{"from": 0}, "text0"]
        assert seen["broadcast_object_list_empty"] == []  # returns at once (torch alone would hang)


def test_reduce(observations):
    for seen in observations:
        assert seen["reduce_mean"] == [1.5, 3.0]
        assert seen["reduce_sum"] == [3.0, 6.0]
        assert seen["reduce_scale"] == [3.0, 6.0]  # scale acts on XLA only, as in the reference
    assert observations[1]["reduce_input_untouched"] == [2.0, 4.0]


def test_pad_across_processes(observations):
    rank0, rank1 = observations
    assert rank0["pad_end"] == [[1, 1], [-1, -1]]
    assert rank0["pad_first"] == [[-1, -1], [1, 1]]
    assert rank1["pad_end"] == [[2, 2], [2, 2]]
    assert rank0["pad_then_gather"] == [[1, 1], [-1, -1], [2, 2], [2, 2]]


def test_synchronize_rng_states(observations):
    assert observations[0]["rng"] == observations[1]["rng"]
