"""Sharding properties of prepared dataloaders, with processes simulated in one process.

Each simulated process builds its own prepared loader (as every rank would); the checks are those of
the data issue: the union of the shards is the dataset (plus only documented padding), nothing is
given twice, every process gets the same number of batches with ``even_batches``, and the
gather-for-metrics rule (concatenate the processes' batches, cut the last global batch to
``remainder``) gives back each sample once, in dataset order.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

from accelerando.core.gradient_state import GradientState
from accelerando.data_loader import (
    BatchSamplerShard,
    DataLoaderShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    prepare_data_loader,
)
from accelerando.plugins.dataloader import DataLoaderConfiguration


class Stream(IterableDataset):
    """An iterable dataset without a length."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):
        return iter(range(self.length))


def _order(length: int, shuffle: bool, seed: int) -> list[int]:
    if not shuffle:
        return list(range(length))
    loader = DataLoader(
        range(length), batch_size=1, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )
    return [int(b) for b in loader]


def _run_process(config: dict, process: int) -> list[tuple[list[int], bool, int]]:
    length, size, n = config["length"], config["batch_size"], config["num_processes"]
    if config["iterable"]:
        base = DataLoader(Stream(length), batch_size=size, drop_last=config["drop_last"])
    else:
        generator = torch.Generator().manual_seed(config["seed"])
        base = DataLoader(
            list(range(length)),
            batch_size=size,
            shuffle=config["shuffle"],
            drop_last=config["drop_last"],
            generator=generator,
        )
    loader = prepare_data_loader(
        base,
        num_processes=n,
        process_index=process,
        split_batches=config["split"],
        even_batches=config["even"],
    )
    seen = []
    for batch in loader:
        assert GradientState().active_dataloader is loader
        assert GradientState().end_of_dataloader == loader.end_of_dataloader
        seen.append((batch.tolist(), loader.end_of_dataloader, loader.remainder))
    assert GradientState().active_dataloader is None
    if not config["iterable"]:
        assert len(loader) == len(seen), "len() must match the batches produced"
    return seen


@st.composite
def configs(draw):
    n = draw(st.integers(1, 4))
    split = draw(st.booleans())
    per = draw(st.integers(1, 5))
    iterable = draw(st.booleans())
    return {
        "num_processes": n,
        "split": split,
        "batch_size": per * n if split else per,
        "length": draw(st.integers(1, 50)),
        "even": draw(st.booleans()),
        "drop_last": draw(st.booleans()),
        "shuffle": draw(st.booleans()) and not iterable,
        "iterable": iterable,
        "seed": draw(st.integers(0, 3)),
    }


def _expected(config: dict, order: list[int]) -> list[int]:
    length, size, n = config["length"], config["batch_size"], config["num_processes"]
    if not config["drop_last"]:
        return order
    global_size = size if config["split"] else size * n
    if config["iterable"] or config["split"]:
        return order[: (length // global_size) * global_size]
    return order[: (length // size // n) * n * size]


@settings(max_examples=150, deadline=None)
@given(configs())
def test_shards_partition_the_dataset(config):
    n = config["num_processes"]
    runs = [_run_process(config, p) for p in range(n)]
    order = _order(config["length"], config["shuffle"], config["seed"])
    padded = config["even"] and not config["drop_last"] and n > 1
    counts = {len(run) for run in runs}
    if padded:
        assert len(counts) == 1, f"even_batches must give every process the same count, got {counts}"
    # The end flag is set exactly on each process's last batch.
    for run in runs:
        assert [flag for _, flag, _ in run] == [False] * (len(run) - 1) + [True] * bool(run)
    # gather_for_metrics: concatenate per step in process order, cut the final step to remainder.
    gathered: list[int] = []
    steps = max(counts)
    for step in range(steps):
        global_batch = [i for run in runs if step < len(run) for i in run[step][0]]
        if step == steps - 1:
            remainder = runs[0][-1][2]
            if remainder > 0:
                global_batch = global_batch[:remainder]
        gathered.extend(global_batch)
    assert gathered == _expected(config, order)
    # Everything handed out beyond the real samples is padding taken from the start of the order.
    handed = sorted(i for run in runs for batch, _, _ in run for i in batch)
    assert set(handed) == set(_expected(config, order)) | (set(order[: len(handed)]) if padded else set())


def test_batch_sampler_shard_examples():
    sampler = BatchSampler(SequentialSampler(range(10)), 3, False)
    assert [list(BatchSamplerShard(sampler, 2, p)) for p in range(2)] == [
        [[0, 1, 2], [6, 7, 8]],
        [[3, 4, 5], [9, 0, 1]],
    ]
    assert [list(BatchSamplerShard(sampler, 2, p, even_batches=False)) for p in range(2)] == [
        [[0, 1, 2], [6, 7, 8]],
        [[3, 4, 5], [9]],
    ]
    split = BatchSampler(SequentialSampler(range(10)), 4, False)
    assert [list(BatchSamplerShard(split, 2, p, split_batches=True)) for p in range(2)] == [
        [[0, 1], [4, 5], [8, 9]],
        [[2, 3], [6, 7], [0, 1]],
    ]
    assert BatchSamplerShard(split, 2, 0, split_batches=True).remainder == 2


def test_custom_batch_sampler_without_batch_size_is_kept():
    class Buckets:
        def __iter__(self):
            return iter([[0], [1, 2], [3, 4, 5], [6]])

        def __len__(self):
            return 4

    shards = [list(BatchSamplerShard(Buckets(), 3, p)) for p in range(3)]
    assert shards == [[[0], [6]], [[1, 2], [0]], [[3, 4, 5], [1, 2]]]


def test_iterable_shard_examples():
    shards = [
        list(IterableDatasetShard(range(10), batch_size=2, num_processes=2, process_index=p))
        for p in range(2)
    ]
    assert shards == [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7, 0, 1]]
    dropped = IterableDatasetShard(range(10), batch_size=2, drop_last=True, num_processes=2, process_index=1)
    assert list(dropped) == [2, 3, 6, 7] and len(dropped) == 4


def test_iterable_with_workers_keeps_order_without_duplicates():
    base = DataLoader(Stream(37), batch_size=3, num_workers=2)
    runs = []
    for p in range(2):
        loader = prepare_data_loader(base, num_processes=2, process_index=p)
        runs.append([batch.tolist() for batch in loader])
    merged = [i for step in zip(*runs, strict=True) for batch in step for i in batch]
    assert merged[:37] == list(range(37))


def test_seedable_sampler_same_order_everywhere_and_changes_with_epoch():
    a, b = SeedableRandomSampler(range(20), data_seed=7), SeedableRandomSampler(range(20), data_seed=7)
    assert list(a) == list(b)
    a.set_epoch(1)
    b.set_epoch(1)
    first, second = list(a), list(b)
    assert first == second and sorted(first) == list(range(20))
    a.set_epoch(0)
    assert list(a) != first
    loaders = [
        prepare_data_loader(
            DataLoader(range(24), batch_size=4, shuffle=True),
            num_processes=2,
            process_index=p,
            use_seedable_sampler=True,
            data_seed=3,
        )
        for p in range(2)
    ]
    epoch0 = [sorted(i for b in loader for i in b.tolist()) for loader in loaders]
    assert sorted(epoch0[0] + epoch0[1]) == list(range(24))


def test_prepared_loader_behaves_like_a_dataloader():
    base = DataLoader(list(range(22)), batch_size=4, num_workers=0, collate_fn=lambda x: torch.tensor(x) * 10)
    loader = prepare_data_loader(base, num_processes=2, process_index=1)
    assert isinstance(loader, DataLoader) and isinstance(loader, DataLoaderShard)
    assert loader.batch_size == 4 and loader.total_batch_size == 8 and loader.total_dataset_length == 22
    assert loader.dataset is base.dataset and len(loader) == 3
    assert [b.tolist() for b in loader] == [[40, 50, 60, 70], [120, 130, 140, 150], [200, 210, 0, 10]]
    assert loader.remainder == 6 and loader.iteration == 1


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="multiple of 3"):
        prepare_data_loader(
            DataLoader(range(10), batch_size=4), num_processes=3, process_index=0, split_batches=True
        )
    with pytest.raises(ValueError, match="empty dataset"):
        prepare_data_loader(DataLoader([], batch_size=4), num_processes=1, process_index=0)
    with pytest.raises(ValueError, match="put_on_device"):
        prepare_data_loader(DataLoader(range(4)), num_processes=1, process_index=0, dispatch_batches=True)
    with pytest.raises(ValueError, match="batch_size"):
        prepare_data_loader(DataLoader(range(4), batch_size=None), num_processes=2, process_index=0)
    with pytest.raises(TypeError):
        prepare_data_loader([1, 2, 3], num_processes=1, process_index=0)
    with pytest.raises(ValueError, match="process_index"):
        BatchSamplerShard(BatchSampler(range(4), 2, False), 2, 2)
    with pytest.raises(TypeError, match="even_batches"):
        DataLoaderConfiguration(even_batches="yes")


def test_configuration_defaults():
    config = DataLoaderConfiguration()
    assert config.to_kwargs() == {
        "split_batches": False,
        "dispatch_batches": None,
        "even_batches": True,
        "use_seedable_sampler": False,
        "data_seed": None,
        "non_blocking": False,
        "use_stateful_dataloader": False,
    }


@settings(max_examples=80, deadline=None)
@given(configs())
def test_dispatch_cuts_partition_the_dataset(config):
    """The main process's cutting of global batches, checked for every simulated process at once."""
    from accelerando.data_loader import DataLoaderDispatcher

    n, size = config["num_processes"], config["batch_size"]
    data = [{"id": torch.tensor(i), "tag": f"t{i}"} for i in range(config["length"])]
    loader = DataLoaderDispatcher(
        data,
        split_batches=config["split"],
        even_batches=config["even"],
        _drop_last=config["drop_last"],
        batch_size=size,
        drop_last=config["drop_last"],
    )
    steps = list(loader._steps(0, n))
    gathered: list[int] = []
    for index, messages in enumerate(steps):
        assert len(messages) == n
        is_last = index == len(steps) - 1
        assert all(message[0] == is_last for message in messages)
        parts = [message[2] for message in messages if message[2] is not None]
        if config["even"] and not config["drop_last"]:
            assert len(parts) == n, "even_batches: every process gets a batch at every step"
        for part in parts:
            assert part["tag"] == [f"t{int(i)}" for i in part["id"].tolist()]
        merged = [int(i) for part in parts for i in part["id"].tolist()]
        if is_last and messages[0][1] > 0:
            merged = merged[: messages[0][1]]
        gathered.extend(merged)
    assert gathered == _expected(config, list(range(config["length"])))
