"""The asynchronous save's host snapshot never hands one tensor another's copy.

Found by the 20-trial random-SIGKILL test: an asynchronous checkpoint held rank 0's torch random state
wrong, so a resume from it diverged from the first step on. ``snapshot_tree``'s memo is keyed by storage
address; the sampler generator's ``get_state()`` (a temporary) was copied and freed, and the global
``torch.get_rng_state()`` allocated next at the same address got the sampler's copy.
"""

from __future__ import annotations

import torch

from accelerando.checkpointing.snapshot import snapshot_tree


def test_temporaries_freed_between_copies_each_keep_their_own_copy() -> None:
    memo: dict = {}
    copies = [snapshot_tree(torch.full((5056,), i, dtype=torch.uint8), memo) for i in range(50)]
    assert [int(c[0]) for c in copies] == list(range(50))
    assert all(bool((c == i).all()) for i, c in enumerate(copies))


def test_the_global_random_state_is_not_mistaken_for_a_generators_state() -> None:
    torch.manual_seed(3)
    memo: dict = {}
    sampler_state = snapshot_tree({"generator": torch.Generator().manual_seed(11).get_state()}, memo)
    global_state = snapshot_tree({"torch": torch.get_rng_state()}, memo)
    assert torch.equal(global_state["torch"], torch.get_rng_state())
    assert torch.equal(sampler_state["generator"], torch.Generator().manual_seed(11).get_state())


def test_tensors_sharing_a_storage_still_share_its_copy() -> None:
    base = torch.arange(6.0)
    copy = snapshot_tree({"a": base[:3], "b": base[3:]})
    assert copy["a"].untyped_storage().data_ptr() == copy["b"].untyped_storage().data_ptr()
    assert copy["b"].tolist() == [3.0, 4.0, 5.0]
