"""Device placement, no read-ahead on the hot path, and the less common DataLoader shapes."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler

from accelerando.core.gradient_state import GradientState
from accelerando.data_loader import DataLoaderDispatcher, prepare_data_loader


class Counting(Dataset):
    def __init__(self, length: int) -> None:
        self.length = length
        self.calls = 0

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index):
        if isinstance(index, list):  # batched access (a BatchSampler given as `sampler`)
            self.calls += len(index)
            return torch.tensor(index)
        self.calls += 1
        return {"x": torch.tensor([float(index)]), "id": index}


@pytest.mark.parametrize("non_blocking", [False, True])
def test_no_batch_is_read_ahead_for_map_style_data(non_blocking):
    dataset = Counting(10)
    loader = prepare_data_loader(
        DataLoader(dataset, batch_size=3),
        num_processes=1,
        process_index=0,
        put_on_device=True,
        device=torch.device("cpu"),
        non_blocking=non_blocking,
    )
    for step, batch in enumerate(loader):
        assert dataset.calls == min(3 * (step + 1), 10), "a batch was loaded before it was asked for"
        assert batch["x"].device.type == "cpu"
        assert loader.end_of_dataloader == (step == 3) == GradientState().end_of_dataloader


def test_batches_are_moved_to_the_device():
    loader = prepare_data_loader(
        DataLoader(Counting(5), batch_size=2),
        num_processes=1,
        process_index=0,
        put_on_device=True,
        device=torch.device("meta"),
    )
    batches = list(loader)
    assert all(b["x"].device.type == "meta" for b in batches) and batches[0]["id"].device.type == "meta"


def test_batch_sampler_given_as_sampler():
    dataset = Counting(9)
    sampler = BatchSampler(SequentialSampler(range(9)), 2, False)
    loaders = [
        prepare_data_loader(
            DataLoader(dataset, sampler=sampler, batch_size=None), num_processes=2, process_index=p
        )
        for p in range(2)
    ]
    assert [b.tolist() for b in loaders[0]] == [[0, 1], [4, 5], [8, 0]]
    assert [b.tolist() for b in loaders[1]] == [[2, 3], [6, 7], [1, 2]]
    assert loaders[1].remainder == 1 and loaders[1].total_batch_size == 4


def test_custom_batch_sampler_without_length():
    class NoLength:
        batch_size = 2

        def __iter__(self):
            return iter([[0, 1], [2, 3], [4]])

    loader = prepare_data_loader(
        DataLoader(Counting(5), batch_sampler=NoLength()), num_processes=2, process_index=0
    )
    flags = [(b["id"].tolist(), loader.end_of_dataloader) for b in loader]
    assert flags == [([0, 1], False), ([4, 0], True)]
    with pytest.raises(TypeError, match="__len__"):
        len(loader)


def test_dispatcher_in_one_process():
    loader = prepare_data_loader(
        DataLoader(Counting(7), batch_size=3),
        num_processes=1,
        process_index=0,
        put_on_device=True,
        device=torch.device("cpu"),
        dispatch_batches=True,
    )
    assert isinstance(loader, DataLoaderDispatcher)
    ids = [b["id"].tolist() for b in loader]
    assert ids == [[0, 1, 2], [3, 4, 5], [6]] and loader.end_of_dataloader
    assert len(loader) == 3 and loader.total_batch_size == 3
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["position"] == 0


def test_distributed_sampler_is_not_sharded_twice():
    from torch.utils.data import DistributedSampler

    data = list(range(8))
    shards = []
    for rank in range(2):
        sampler = DistributedSampler(data, num_replicas=2, rank=rank, shuffle=False)
        loader = prepare_data_loader(
            DataLoader(data, batch_size=2, sampler=sampler), num_processes=2, process_index=rank
        )
        shards.append([i for b in loader for i in b.tolist()])
    assert sorted(shards[0] + shards[1]) == data


def test_preparing_a_prepared_loader_shards_its_original_sampler():
    once = prepare_data_loader(
        DataLoader(list(range(8)), batch_size=2, shuffle=True), num_processes=1, process_index=0
    )
    twice = [prepare_data_loader(once, num_processes=2, process_index=p) for p in range(2)]
    seen = []
    for loader in twice:
        # The simulated ranks share one generator object: reseed it as the per-epoch sync would.
        loader.synchronized_generator.manual_seed(3)
        seen += [i for b in loader for i in b.tolist()]
    seen.sort()
    assert seen == list(range(8))
