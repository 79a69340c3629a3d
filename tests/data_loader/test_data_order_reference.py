"""Same seed, same data order: plain PyTorch (one process) and the reference library (1 and 2 processes).

The reference ``accelerate`` package is only run, in subprocesses, to record which sample indices each
batch holds; the lists are compared with accelerando's for the same cases. One launch per library and
process count covers every case.
"""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from accelerando.test_utils import run_distributed
from suite_support import reset_accelerator_state

needs_reference = pytest.mark.skipif(
    importlib.util.find_spec("accelerate") is None, reason="the reference accelerate package is not installed"
)

# (length, batch size, drop_last, epochs, seedable sampler, seed, data_seed)
Case = tuple[int, int, bool, int, bool, int, "int | None"]


def _cases() -> list[Case]:
    draw = random.Random(16)
    cases: list[Case] = [(10, 3, False, 3, False, 0, None), (10, 2, False, 3, False, 1, None)]
    cases += [(12, 4, True, 2, True, 0, None), (9, 2, False, 2, True, 3, 7)]
    for _ in range(6):
        cases.append(
            (
                draw.randint(5, 40),
                draw.randint(1, 6),
                draw.random() < 0.3,
                draw.randint(1, 3),
                draw.random() < 0.4,
                draw.randint(0, 1000),
                draw.choice([None, draw.randint(0, 50)]),
            )
        )
    return cases


def record_orders(library: str, cases: list[Case]) -> list[list[list[list[int]]]]:
    """In one process of a launch: each case's per-epoch list of batches (sample indices)."""
    module = importlib.import_module(library)
    utils = importlib.import_module(f"{library}.utils")
    out = []
    for length, batch_size, drop_last, epochs, seedable, seed, data_seed in cases:
        config = utils.DataLoaderConfiguration(use_seedable_sampler=seedable, data_seed=data_seed)
        accelerator = module.Accelerator(cpu=True, dataloader_config=config)
        utils.set_seed(seed)
        dataset = TensorDataset(torch.arange(length))
        loader = accelerator.prepare(
            DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=drop_last)
        )
        epochs_seen = []
        for epoch in range(epochs):
            if seedable and epoch % 2 == 1:
                loader.set_epoch(
                    epoch
                )  # explicit on odd epochs, implicit (the sampler's own count) otherwise
            epochs_seen.append([batch[0].tolist() for batch in loader])
            torch.rand(5)  # training draws from the global generator between epochs
        out.append(epochs_seen)
    return out


def _plain_order(length: int, batch_size: int, drop_last: bool, epochs: int, seed: int) -> list:
    torch.manual_seed(seed)
    loader = DataLoader(
        TensorDataset(torch.arange(length)), batch_size=batch_size, shuffle=True, drop_last=drop_last
    )
    seen = []
    for _ in range(epochs):
        seen.append([batch[0].tolist() for batch in loader])
        torch.rand(5)
    return seen


@settings(max_examples=25, deadline=None)
@given(
    length=st.integers(1, 50),
    batch_size=st.integers(1, 8),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_one_process_order_is_plain_pytorch(length: int, batch_size: int, drop_last: bool, seed: int) -> None:
    from accelerando import Accelerator
    from accelerando.utils import set_seed

    if drop_last and length < batch_size:
        return  # an empty loader: nothing to compare
    reset_accelerator_state()
    accelerator = Accelerator(cpu=True)
    set_seed(seed)
    loader = accelerator.prepare(
        DataLoader(
            TensorDataset(torch.arange(length)), batch_size=batch_size, shuffle=True, drop_last=drop_last
        )
    )
    seen = []
    for _ in range(2):
        seen.append([batch[0].tolist() for batch in loader])
        torch.rand(5)
    # set_seed also seeds python and numpy; the torch draws are what decide the order
    assert seen == _plain_order(length, batch_size, drop_last, 2, seed)


@needs_reference
@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_orders_match_reference(processes: int) -> None:
    cases = _cases()
    ours = run_distributed(record_orders, processes, "accelerando", cases)
    theirs = run_distributed(record_orders, processes, "accelerate", cases)
    for rank in range(processes):
        for case, mine, reference in zip(cases, ours[rank], theirs[rank], strict=True):
            assert mine == reference, f"rank {rank}, case {case}"


def test_sampler_access_and_gradient_state_on_skip_loader() -> None:
    from accelerando.core.gradient_state import GradientState
    from accelerando.data_loader import DataLoaderAdapter, SkipDataLoader, get_sampler, prepare_data_loader

    plain = DataLoader(TensorDataset(torch.arange(6)), batch_size=2, shuffle=True)
    assert get_sampler(plain) is plain.sampler
    prepared = prepare_data_loader(plain, num_processes=1, process_index=0)
    replacement = torch.utils.data.SequentialSampler(range(6))
    prepared.set_sampler(replacement)
    assert prepared.get_sampler() is replacement
    assert [b[0].tolist() for b in prepared] == [[0, 1], [2, 3], [4, 5]]

    skip = SkipDataLoader(list(range(6)), skip_batches=1, batch_size=2)
    ends = []
    for _ in skip:
        ends.append((skip.end_of_dataloader, GradientState().end_of_dataloader))
    assert ends == [(False, False), (True, True)]

    adapter = DataLoaderAdapter(list(range(4)), batch_size=2)
    assert isinstance(adapter, DataLoader) and len(adapter) == 2
    assert [b.tolist() for b in adapter] == [[0, 1], [2, 3]]
