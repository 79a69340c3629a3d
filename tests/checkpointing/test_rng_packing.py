"""Random states are packed compactly for the checkpoint and come back exactly as they were."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from accelerando.checkpointing.rng import _from_plain, _to_plain

_ITEMS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
    st.integers(min_value=0, max_value=2**64 - 1),
    st.integers(min_value=0, max_value=2**64 - 1).map(np.uint64),
)


@settings(max_examples=200, deadline=None)
@given(items=st.lists(_ITEMS, min_size=0, max_size=80), as_tuple=st.booleans())
def test_any_sequence_of_numbers_comes_back_with_its_types(items: list[object], as_tuple: bool) -> None:
    value = tuple(items) if as_tuple else items
    back = _from_plain(_to_plain(value))
    assert type(back) is type(value)
    assert len(back) == len(value)
    for original, restored in zip(value, back, strict=True):
        if isinstance(original, np.generic):  # NumPy scalars are stored as plain numbers
            assert restored == original.item()
        else:
            assert type(restored) is type(original) and restored == original


def test_pythons_mersenne_twister_state_is_packed_and_restored() -> None:
    random.seed(1234)
    state = random.getstate()
    plain = _to_plain(state)
    assert isinstance(plain, tuple) and isinstance(plain[1], dict)  # the 625 ints as one bytes object
    assert _from_plain(plain) == state
