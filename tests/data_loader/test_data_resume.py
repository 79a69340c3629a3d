"""Exact resume: state_dict / load_state_dict and skip_first_batches give the uninterrupted batches."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from accelerando.data_loader import prepare_data_loader, skip_first_batches
from accelerando.data_loader.prepare import SkipBatchSampler

EPOCHS = 3

# torchdata's StatefulDataLoader calls a deprecated torch function on construction.
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")


class Counting(Dataset):
    """A map-style dataset that counts how often ``__getitem__`` runs."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.calls = 0

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        self.calls += 1
        return torch.tensor([index, index * index], dtype=torch.float64)


def _make(workers: int, shuffle: bool, seed: int, stateful: bool, seedable: bool = False):
    torch.manual_seed(seed)
    base = DataLoader(Counting(23), batch_size=3, shuffle=shuffle, num_workers=workers)
    return prepare_data_loader(
        base,
        num_processes=2,
        process_index=1,
        use_stateful_dataloader=stateful,
        use_seedable_sampler=seedable,
        data_seed=5,
    )


def _uninterrupted(loader) -> list[tuple[int, torch.Tensor]]:
    return [(epoch, batch) for epoch in range(EPOCHS) for batch in loader]


def _run_until(loader, stop: int) -> dict:
    """Consume ``stop`` batches over epochs; return the state saved in the loop body at that point."""
    done = 0
    for _ in range(EPOCHS):
        for _batch in loader:
            done += 1
            if done == stop:
                return loader.state_dict()
    raise AssertionError("stop beyond the run")


def _resume(loader, state: dict, stateful: bool) -> list[tuple[int, torch.Tensor]]:
    loader.load_state_dict(state)
    out = []
    first = True
    for epoch in range(state["epoch"], EPOCHS):
        active = loader
        if first and not stateful:
            active = skip_first_batches(loader, state["position"])
        first = False
        out.extend((epoch, batch) for batch in active)
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("stateful", [False, True])
def test_resume_gives_the_uninterrupted_batches(workers, shuffle, stateful):
    reference = _uninterrupted(_make(workers, shuffle, seed=0, stateful=stateful))
    per_epoch = len(reference) // EPOCHS
    # Mid-epoch, the last batch of an epoch (boundary), and inside a later epoch.
    stops = (2, per_epoch, per_epoch + 1, 2 * per_epoch + 2)
    if workers:
        stops = (per_epoch, 2 * per_epoch + 2)  # worker start-up is the cost: fewer points
    for stop in stops:
        state = _run_until(_make(workers, shuffle, seed=0, stateful=stateful), stop)
        assert set(state) >= {"epoch", "position"}
        # A different global seed proves the order comes from the saved state, not from luck.
        resumed = _resume(_make(workers, shuffle, seed=123, stateful=stateful), state, stateful)
        expected = reference[stop:]
        assert len(resumed) == len(expected), f"stop={stop}"
        for (epoch_a, a), (epoch_b, b) in zip(resumed, expected, strict=True):
            assert epoch_a == epoch_b and torch.equal(a, b), f"stop={stop}"


def test_state_between_epochs_and_seedable_sampler():
    loader = _make(0, True, seed=0, stateful=True, seedable=True)
    reference = _uninterrupted(loader)
    loader = _make(0, True, seed=0, stateful=True, seedable=True)
    list(loader)
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["position"] == 0 and state["sampler_seed"] == 5
    resumed = _resume(_make(0, True, seed=9, stateful=True, seedable=True), state, stateful=True)
    per_epoch = len(reference) // EPOCHS
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(resumed, reference[per_epoch:], strict=True))


def test_default_mode_does_not_restore_the_position():
    loader = _make(0, False, seed=0, stateful=False)
    state = _run_until(loader, 3)
    fresh = _make(0, False, seed=0, stateful=False)
    fresh.load_state_dict(state)
    assert len(list(fresh)) == len(fresh)


def test_skip_first_batches_loads_no_skipped_sample():
    skipped_batches = 10**6
    dataset = Counting(2 * skipped_batches + 5)
    plain = DataLoader(dataset, batch_size=2)
    skipped = skip_first_batches(plain, skipped_batches)
    assert isinstance(skipped.batch_sampler, SkipBatchSampler)
    first = next(iter(skipped))
    assert first[:, 0].tolist() == [2 * skipped_batches, 2 * skipped_batches + 1]
    assert dataset.calls == 2
    assert len(skipped) == 3


def test_skip_on_prepared_loaders_keeps_settings_and_progress():
    dataset = Counting(2 * 10**6 + 5)
    base = DataLoader(dataset, batch_size=2, shuffle=True, collate_fn=lambda rows: torch.stack(rows) + 0.5)
    loader = prepare_data_loader(
        base, num_processes=2, process_index=0, use_seedable_sampler=True, data_seed=1
    )
    skipped = skip_first_batches(loader, 5 * 10**5)
    assert len(skipped) == len(loader) - 5 * 10**5
    batches = list(skipped)
    assert dataset.calls == 2 * len(batches)
    assert batches[0].frac().eq(0.5).all(), "the collate function is kept"
    assert loader.iteration == 1, "finishing the resumed epoch moves the original to the next epoch"
    assert skipped.end_of_dataloader and skipped.remainder == -1 or skipped.remainder > 0


def test_skip_on_iterable_data_reads_through():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(10))

    skipped = skip_first_batches(DataLoader(Stream(), batch_size=3), 2)
    assert [b.tolist() for b in skipped] == [[6, 7, 8], [9]]
    loader = prepare_data_loader(DataLoader(Stream(), batch_size=2), num_processes=2, process_index=1)
    assert [b.tolist() for b in skip_first_batches(loader, 1)] == [[6, 7], [0, 1]]
    with pytest.raises(ValueError, match="non-negative"):
        skip_first_batches(loader, -1)


def test_dispatcher_resume_and_direct_construction():
    from accelerando.data_loader import DataLoaderDispatcher, DataLoaderShard

    def make(seed=0):
        torch.manual_seed(seed)
        return prepare_data_loader(
            DataLoader(Counting(11), batch_size=2, shuffle=True),
            num_processes=1,
            process_index=0,
            put_on_device=True,
            device=torch.device("cpu"),
            dispatch_batches=True,
            use_stateful_dataloader=True,
        )

    reference = [b.clone() for b in make()]
    loader = make()
    assert isinstance(loader, DataLoaderDispatcher)
    state = _run_until(loader, 2)
    resumed = make(seed=1)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(list(resumed), reference[2:], strict=True))
    direct = DataLoaderShard(list(range(16)), batch_size=4)
    assert [b.tolist() for b in direct] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert [b.tolist() for b in skip_first_batches(direct, 3)] == [[12, 13, 14, 15]]
    assert direct.iteration == 2


class Resumable(IterableDataset):
    """An iterable dataset that can save and restore its position (torchdata's Stateful protocol)."""

    def __init__(self, length: int) -> None:
        self.length, self.position, self.reads, self._start = length, 0, 0, 0

    def __iter__(self):
        start, self._start = self._start, 0
        for i in range(start, self.length):
            self.position = i + 1
            self.reads += 1
            yield torch.tensor([i, 10 * i])

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self._start = state["position"]


@pytest.mark.parametrize(("processes", "workers"), [(1, 0), (2, 0), (2, 2)])
def test_stateful_iterable_resumes_through_torchdata(processes, workers):
    pytest.importorskip("torchdata.stateful_dataloader")
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make():
        base = DataLoader(Resumable(29), batch_size=3, num_workers=workers)
        return prepare_data_loader(
            base, num_processes=processes, process_index=processes - 1, use_stateful_dataloader=True
        )

    reference = _uninterrupted(make())
    assert isinstance(make(), StatefulDataLoader)
    for stop in (2, len(reference) // EPOCHS + 1):
        state = _run_until(make(), stop)
        assert "loader_state" in state
        resumed_loader = make()
        resumed = _resume(resumed_loader, state, stateful=True)
        assert len(resumed) == len(reference) - stop, f"stop={stop}"
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(resumed, reference[stop:], strict=True))
        if workers == 0:
            dataset = resumed_loader.dataset
            inner = dataset.dataset if processes > 1 else dataset
            per_epoch_reads = 29
            # The resumed epoch does not re-read what was consumed before the save.
            assert inner.reads < per_epoch_reads * (EPOCHS - state["epoch"])
