"""Iterable-data state dicts hold plain data only: they load with ``torch.load(weights_only=True)``.

Samples that are transformers ``BatchEncoding`` objects or namedtuples are stored as plain dicts /
tuples; resuming still gives the batches of an uninterrupted run, with their original types.
"""

from __future__ import annotations

import io
from collections import namedtuple
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from accelerando.data_loader import prepare_data_loader
from accelerando.data_loader.batches import like_sample, to_plain
from accelerando.data_loader.samplers import IterableDatasetShard

# torchdata's StatefulDataLoader calls a deprecated torch function on construction.
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")

Pair = namedtuple("Pair", ["x", "y"])
LENGTH = 23  # not a multiple of the global batch size: the last global batch is padded


def _encoding(i: int) -> Any:
    from transformers import BatchEncoding

    return BatchEncoding({"input_ids": torch.tensor([i, i + 1]), "attention_mask": torch.tensor([1, i % 2])})


def _pair(i: int) -> Pair:
    return Pair(torch.tensor([i, 2 * i]), torch.tensor(float(i)))


class Stream(IterableDataset):
    """An iterable dataset of ``make(i)`` samples; with ``stateful`` it saves its own position."""

    def __init__(self, make: Any, stateful: bool = False) -> None:
        self.make, self.position, self._start = make, 0, 0
        if stateful:
            self.state_dict = lambda: {"position": self.position}
            self.load_state_dict = self._load

    def _load(self, state: dict) -> None:
        self._start = state["position"]

    def __iter__(self) -> Iterator[Any]:
        start, self._start = self._start, 0
        for i in range(start, LENGTH):
            self.position = i + 1
            yield self.make(i)


def _roundtrip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict) or hasattr(a, "keys"):
        return list(a.keys()) == list(b.keys()) and all(_same(a[k], b[k]) for k in a.keys())
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


MAKERS = pytest.mark.parametrize("make", [_encoding, _pair], ids=["BatchEncoding", "namedtuple"])


@MAKERS
@pytest.mark.parametrize("stateful", [False, True])
def test_shard_state_is_plain_and_resumes(make, stateful):
    def shard() -> IterableDatasetShard:
        return IterableDatasetShard(Stream(make, stateful), batch_size=2, num_processes=3, process_index=2)

    reference = list(shard())
    for stop in (2, 6):  # whole slices: the shard resumes at global-batch boundaries
        running = shard()
        iterator = iter(running)
        for _ in range(stop):
            next(iterator)
        state = _roundtrip(running.state_dict())
        assert all(type(sample) in (dict, tuple) for sample in state["first"])
        resumed = shard()
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert len(rest) == len(reference) - stop
        assert all(_same(a, b) for a, b in zip(rest, reference[stop:], strict=True))


@MAKERS
@pytest.mark.parametrize("stateful", [False, True])
def test_prepared_loader_state_loads_weights_only_and_resumes(make, stateful):
    pytest.importorskip("torchdata.stateful_dataloader")

    def loader() -> DataLoader:
        base = DataLoader(Stream(make, stateful), batch_size=2)
        return prepare_data_loader(base, num_processes=2, process_index=1, use_stateful_dataloader=True)

    reference = list(loader())
    stop = 2
    running = loader()
    for done, _batch in enumerate(running, start=1):
        if done == stop:
            state = running.state_dict()
            break
    state = _roundtrip(state)
    resumed = loader()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(reference) - stop
    assert all(_same(a, b) for a, b in zip(rest, reference[stop:], strict=True))


def test_accelerator_prepared_loader_state_loads_weights_only():
    from accelerando import Accelerator

    loader = Accelerator(cpu=True).prepare(DataLoader(Stream(_encoding), batch_size=4))
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == 2:
            break
    state = _roundtrip(loader.state_dict())
    loader.load_state_dict(state)
    assert type(batches[0]).__name__ == "BatchEncoding"


@dataclass
class Point:
    x: torch.Tensor
    label: str


def test_to_plain_and_like_sample():
    from transformers import BatchEncoding

    plain = to_plain([_encoding(1), _pair(2), Point(torch.ones(1), "a"), (1, "b"), {"k": [2.0]}])
    assert [type(item) for item in plain] == [dict, tuple, dict, tuple, dict]
    assert _same(_roundtrip({"s": plain})["s"], plain)
    assert type(like_sample(plain[0], _encoding(0))) is BatchEncoding
    assert _same(like_sample(plain[1], _pair(0)), _pair(2))
    assert like_sample(plain[2], Point(torch.zeros(1), "z")) is plain[2]  # no way back: stays plain
    opaque = object()
    assert to_plain(opaque) is opaque
