"""Sharding and dispatching across 2 real processes (gloo on CPU), with nested and uneven batches.

All checks run in one launch: starting processes is the expensive part.
"""

from __future__ import annotations

from collections import namedtuple

import torch
from torch.utils.data import DataLoader, IterableDataset

from suite_support import run_distributed_preloaded

Pair = namedtuple("Pair", ["left", "right"])


class NestedStream(IterableDataset):
    """Samples as nested structures: a dict holding a tensor, a namedtuple and a string."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):
        for i in range(self.length):
            yield {
                "x": torch.tensor([float(i)]),
                "pair": Pair(torch.tensor(i), torch.tensor([i, -i])),
                "name": f"s{i}",
            }


def _gather_ids(loader, key) -> list[int]:
    """gather_for_metrics by hand: all-gather each step, cut the last global batch to remainder."""
    import torch.distributed as dist

    from accelerando.core.gradient_state import GradientState

    ids: list[int] = []
    for batch in loader:
        local = key(batch)
        parts: list = [None] * dist.get_world_size()
        dist.all_gather_object(parts, local)
        merged = [i for part in parts for i in part]
        state = GradientState()
        if state.end_of_dataloader and state.remainder > 0:
            merged = merged[: state.remainder]
        ids.extend(merged)
    return ids


def _awkward_batch(samples: list[int]) -> dict:
    """A collate_fn output with every kind of leaf the dispatcher must carry exactly."""
    first = samples[0]
    grid = torch.arange(12, dtype=torch.float32).reshape(3, 4) + first
    return {
        "transposed": grid.t(),  # not contiguous
        "mask": torch.tensor([True, False, first % 2 == 0]),
        "half": torch.full((2, 2), first / 3, dtype=torch.float16),
        "bf16": torch.full((3,), first / 7, dtype=torch.bfloat16),
        "long": torch.tensor(samples, dtype=torch.int64),
        "scalar": torch.tensor(first),
        "empty": torch.empty(0, 5),
        "nested": [("tag", torch.ones(2, dtype=torch.uint8) * first), {"deep": torch.tensor([first] * 3)}],
        "name": f"batch-{first}",
        "text": [f"{first}:" + "x" * 3000 for _ in range(3)],  # a skeleton longer than one header message
    }


def _check_dispatch_transport(results: dict) -> None:
    """Dispatched batches equal what the main process collated, leaf by leaf, dtype and shape included;
    a sparse tensor (which cannot go as raw bytes) takes the pickled path and arrives too."""
    from accelerando.data_loader import prepare_data_loader

    loader = prepare_data_loader(
        DataLoader(_Stream(12), batch_size=3, collate_fn=_awkward_batch), put_on_device=True
    )
    firsts = []
    for batch in loader:
        first = int(batch["long"][0])
        expected = _awkward_batch(batch["long"].tolist())
        for key in ("transposed", "mask", "half", "bf16", "long", "scalar", "empty"):
            got, want = batch[key], expected[key]
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), key
        assert batch["nested"][0][0] == "tag" and torch.equal(batch["nested"][0][1], expected["nested"][0][1])
        assert torch.equal(batch["nested"][1]["deep"], expected["nested"][1]["deep"])
        assert batch["name"] == f"batch-{first}" and batch["text"] == expected["text"]
        firsts.append(first)
    results["transport_firsts"] = firsts
    # A backend that moves only device tensors (NCCL) takes scatter_object_list: same batches.
    import torch.distributed as dist

    real_backend = dist.get_backend
    dist.get_backend = lambda *args, **kwargs: "nccl"
    try:
        again = prepare_data_loader(
            DataLoader(_Stream(12), batch_size=3, collate_fn=_awkward_batch), put_on_device=True
        )
        pickled = [
            int(batch["long"][0])
            for batch in again
            if torch.equal(batch["transposed"], _awkward_batch(batch["long"].tolist())["transposed"])
        ]
    finally:
        dist.get_backend = real_backend
    assert pickled == firsts
    sparse = prepare_data_loader(
        DataLoader(
            _Stream(8),
            batch_size=2,
            collate_fn=lambda s: {"ids": torch.tensor(s), "sparse": torch.eye(2).to_sparse() * s[0]},
        ),
        put_on_device=True,
    )
    for batch in sparse:
        assert batch["sparse"].is_sparse
        assert torch.equal(batch["sparse"].to_dense(), torch.eye(2) * int(batch["ids"][0]))


class _Stream(IterableDataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):
        return iter(range(self.length))


def _check_all() -> dict:
    from accelerando.data_loader import DataLoaderDispatcher, DataLoaderShard, prepare_data_loader
    from accelerando.state import PartialState

    state = PartialState()
    rank = state.process_index
    results = {}
    # Shard mode, map-style, shuffled with a different global seed on each rank: the shuffle must
    # still agree (the loader synchronises its generator) and gather must give each sample once.
    torch.manual_seed(100 + rank)
    data = [{"id": torch.tensor(i), "pair": (torch.tensor([i]), torch.tensor([i * 2]))} for i in range(21)]
    loader = prepare_data_loader(DataLoader(data, batch_size=4, shuffle=True), put_on_device=True)
    assert isinstance(loader, DataLoaderShard)
    for _epoch in range(2):
        ids = _gather_ids(loader, lambda b: b["id"].tolist())
        assert sorted(ids) == list(range(21)), ids
    results["shard_shuffled_len"] = len(loader)
    # Split batches with an uneven end.
    split = prepare_data_loader(DataLoader(list(range(21)), batch_size=4), split_batches=True)
    assert _gather_ids(split, lambda b: b.tolist()) == list(range(21))
    # even_batches=False: ranks get different counts, nothing is duplicated.
    uneven = prepare_data_loader(DataLoader(list(range(21)), batch_size=4), even_batches=False)
    mine = [i for b in uneven for i in b.tolist()]
    results["uneven"] = mine
    # Dispatch mode over a nested, unsized stream; dict + namedtuple + list of strings survive.
    for split_batches in (False, True):
        dispatched = prepare_data_loader(
            DataLoader(NestedStream(23), batch_size=4), put_on_device=True, split_batches=split_batches
        )
        assert isinstance(dispatched, DataLoaderDispatcher)
        seen = []
        for batch in dispatched:
            assert isinstance(batch["pair"], Pair) and torch.equal(
                batch["pair"].right[:, 0], batch["pair"].left
            )
            assert batch["name"] == [f"s{int(i)}" for i in batch["x"][:, 0].tolist()]
            seen.append(batch["x"].shape[0])
        results[f"dispatch_sizes_{split_batches}"] = seen
        again = prepare_data_loader(
            DataLoader(NestedStream(23), batch_size=4), put_on_device=True, split_batches=split_batches
        )
        ids = _gather_ids(again, lambda b: [int(v) for v in b["x"][:, 0].tolist()])
        assert ids == list(range(23)), ids
    # Iterable data sharded (not dispatched) across ranks.
    sharded = prepare_data_loader(DataLoader(NestedStream(23), batch_size=4), dispatch_batches=False)
    assert _gather_ids(sharded, lambda b: [int(v) for v in b["x"][:, 0].tolist()]) == list(range(23))
    # Seedable sampler without data_seed: the seed is taken from the main process.
    torch.manual_seed(7 + rank)
    seeded = prepare_data_loader(
        DataLoader(list(range(16)), batch_size=2, shuffle=True), use_seedable_sampler=True
    )
    assert sorted(_gather_ids(seeded, lambda b: b.tolist())) == list(range(16))
    results["state"] = loader.state_dict()["epoch"]
    _check_dispatch_transport(results)
    # Through the Accelerator: gather_for_metrics gives each sample once, in order, in both modes.
    from accelerando import Accelerator, DataLoaderConfiguration

    for dispatch in (False, True):
        accelerator = Accelerator(
            cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=dispatch)
        )
        prepared = accelerator.prepare(DataLoader(list(range(21)), batch_size=4))
        gathered = [accelerator.gather_for_metrics(batch) for batch in prepared]
        assert torch.cat(gathered).tolist() == list(range(21)), (dispatch, gathered)
    return results


def test_two_processes_shard_and_dispatch():
    results = run_distributed_preloaded(_check_all, 2)
    assert results[0]["shard_shuffled_len"] == results[1]["shard_shuffled_len"] == 3
    # 21 samples, batches of 4: rank 0 gets batches 0, 2, 4 (the short one), rank 1 batches 1, 3.
    assert results[0]["uneven"] == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19]
    assert results[1]["uneven"] == [4, 5, 6, 7, 12, 13, 14, 15, 20]
    # Non-split dispatch: 8 samples per step, 4 per rank; 23 = 2 full steps + 7, cut 4 + 3 (+1 pad).
    assert results[0]["dispatch_sizes_False"] == [4, 4, 4]
    assert results[0]["dispatch_sizes_True"] == [2, 2, 2, 2, 2, 2]
    assert results[0]["state"] == results[1]["state"] == 2
    # 12 samples in batches of 3, one batch per rank per step: rank 0 gets 0, 6; rank 1 gets 3, 9.
    assert results[0]["transport_firsts"] == [0, 6] and results[1]["transport_firsts"] == [3, 9]
