"""``GradientState().remainder`` and ``gather_for_metrics`` on the last batch, as the reference library has them.

The expected values were observed on the reference library (accelerate 1.15.0) with the same loaders:
map-style data knows ``len(dataset) % global_batch_size`` from the start of the iteration (on one
process too, whatever ``even_batches``; -1 with ``drop_last``); iterable data and the dispatcher learn it
at the last batch (the real samples of the final global batch). ``gather_for_metrics`` cuts the last
gathered batch to that count, so a value repeated to the full batch size on a short last batch (what
``transformers.Trainer`` does with the loss) is counted once per real sample.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from accelerando.test_utils import run_distributed
from suite_support import reset_accelerator_state

BATCH = 8


class Stream(IterableDataset):
    """``n`` float samples, iterable only."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(torch.arange(self.n).float())


def _walk(n: int, kind: str, drop_last: bool = False, **config: Any) -> dict[str, list]:
    """Iterate a prepared loader over ``n`` samples; per step: remainder, end flag, gathered sizes."""
    from accelerando import Accelerator
    from accelerando.utils import DataLoaderConfiguration

    reset_accelerator_state()
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**config))
    data = TensorDataset(torch.arange(n).float()) if kind == "map" else Stream(n)
    loader = acc.prepare(DataLoader(data, batch_size=BATCH, drop_last=drop_last))
    seen: dict[str, list] = {"remainder": [], "end": [], "real": [], "padded": []}
    for batch in loader:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        seen["remainder"].append(acc.gradient_state.remainder)
        seen["end"].append(acc.gradient_state.end_of_dataloader)
        seen["real"].append(len(acc.gather_for_metrics(x)))
        # The same value for every slot of a full batch, as Trainer repeats the loss.
        seen["padded"].append(len(acc.gather_for_metrics(torch.zeros(BATCH))))
    return seen


@pytest.mark.parametrize(
    ("n", "kind", "drop_last", "config", "remainders", "last_padded"),
    [
        (66, "map", False, {}, [2] * 9, 2),
        (66, "map", False, {"even_batches": False}, [2] * 9, 2),
        (64, "map", False, {}, [0] * 8, BATCH),  # divides evenly: nothing to cut
        (66, "map", True, {}, [-1] * 8, BATCH),  # the short batch is dropped
        (66, "iterable", False, {}, [-1] * 8 + [2], 2),
        (64, "iterable", False, {}, [-1] * 7 + [BATCH], BATCH),
        (66, "iterable", True, {}, [-1] * 7 + [BATCH], BATCH),
        (66, "map", False, {"dispatch_batches": True}, [-1] * 8 + [2], 2),
        (66, "iterable", True, {"dispatch_batches": True}, [-1] * 7 + [BATCH], BATCH),
    ],
)
def test_one_process_remainder_and_gather_for_metrics(
    fresh_state: None, n: int, kind: str, drop_last: bool, config: dict, remainders: list, last_padded: int
) -> None:
    seen = _walk(n, kind, drop_last, **config)
    assert seen["remainder"] == remainders
    assert seen["end"] == [False] * (len(remainders) - 1) + [True]
    assert sum(seen["real"]) == (n - n % BATCH if drop_last else n)
    assert seen["padded"] == [BATCH] * (len(remainders) - 1) + [last_padded]


def _two_process_cases() -> dict[str, dict[str, list]]:
    cases = {
        "map": (66, "map", False, {}),
        "map_even": (64, "map", False, {}),
        "map_split": (66, "map", False, {"split_batches": True}),
        "iterable": (66, "iterable", False, {}),
        "iterable_drop_last": (66, "iterable", True, {}),
        "dispatch": (66, "map", False, {"dispatch_batches": True}),
        "dispatch_drop_last": (66, "iterable", True, {"dispatch_batches": True}),
    }
    return {name: _walk(n, kind, drop, **config) for name, (n, kind, drop, config) in cases.items()}


@pytest.mark.slow  # ~30 s: two fresh processes on a shared machine
def test_two_processes_remainder_and_gather_for_metrics() -> None:
    """One launch, every case; the values are the reference library's on 2 processes."""
    for seen in run_distributed(_two_process_cases, 2):
        # 66 samples, 2 x 8 per step: 5 steps, the last one with 2 real samples.
        assert seen["map"]["remainder"] == [2] * 5
        assert seen["map"]["padded"] == [16] * 4 + [2]
        assert sum(seen["map"]["real"]) == 66
        assert seen["map_even"]["remainder"] == [0] * 4
        assert seen["map_even"]["padded"] == [16] * 4
        assert seen["map_split"]["remainder"] == [2] * 9  # global batch of 8 split in two
        assert seen["map_split"]["padded"] == [16] * 8 + [2]
        assert seen["iterable"]["remainder"] == [-1] * 4 + [2]
        assert seen["iterable"]["padded"] == [16] * 4 + [2]
        assert sum(seen["iterable"]["real"]) == 66
        assert seen["iterable_drop_last"]["remainder"] == [-1] * 3 + [16]
        assert seen["dispatch"]["remainder"] == [-1] * 4 + [2]
        assert seen["dispatch"]["padded"] == [16] * 4 + [2]
        assert sum(seen["dispatch"]["real"]) == 66
        # drop_last: the step before the dropped tail is the last one, and is flagged so.
        assert seen["dispatch_drop_last"]["remainder"] == [-1] * 3 + [16]
        assert seen["dispatch_drop_last"]["end"] == [False] * 3 + [True]
