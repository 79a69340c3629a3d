"""A stateful loader left with ``break`` (and ``end()`` called inside the loop) resumes right after the
last batch it gave out, as torchdata's own StatefulDataLoader does."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchdata.stateful_dataloader")

from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

from accelerando.data_loader import DataLoaderDispatcher, DataLoaderShard, SkipDataLoader  # noqa: E402


def _first_batch_after_break(make: type, **kwargs: object) -> list[int]:
    loader = make(list(range(64)), batch_size=4, **kwargs)
    for index, _ in enumerate(loader):
        if index == 7:
            if hasattr(loader, "end"):
                loader.end()
            break
    state = loader.state_dict()
    resumed = make(list(range(64)), batch_size=4, **kwargs)
    resumed.load_state_dict(state)
    return next(iter(resumed)).tolist()


@pytest.mark.parametrize("make", [SkipDataLoader, DataLoaderShard, DataLoaderDispatcher])
def test_break_then_resume_continues_after_the_last_batch_given_out(make: type, fresh_state: None) -> None:
    from accelerando import Accelerator

    Accelerator()
    expected = _first_batch_after_break(StatefulDataLoader)
    assert expected == [32, 33, 34, 35]
    assert _first_batch_after_break(make, use_stateful_dataloader=True) == expected


def test_skip_loader_state_is_torchdatas_as_of_the_batch_given_out(fresh_state: None) -> None:
    reference = StatefulDataLoader(list(range(64)), batch_size=4, generator=torch.Generator().manual_seed(1))
    ours = SkipDataLoader(
        list(range(64)),
        batch_size=4,
        generator=torch.Generator().manual_seed(1),
        use_stateful_dataloader=True,
    )
    for loader in (reference, ours):
        for index, _ in enumerate(loader):
            if index == 4:
                break
    assert ours.state_dict() == reference.state_dict()
