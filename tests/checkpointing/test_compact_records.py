"""Random states and manifests are written compactly and cheaply, and read back exactly as they were."""

from __future__ import annotations

import json
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from accelerando.checkpointing.digest import FileEntry
from accelerando.checkpointing.manifest import Manifest
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


_NAMES = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,15}(/[A-Za-z0-9_][A-Za-z0-9_.-]{0,8})?", fullmatch=True)
_ENTRIES = st.builds(
    FileEntry,
    st.integers(min_value=0, max_value=2**63 - 1),
    st.integers(min_value=0, max_value=2**64 - 1),
    st.sampled_from(["xxh3_64-p64m", "crc32-p64m", "crc32", "xxh3_64"]),
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(
    files=st.dictionaries(_NAMES, _ENTRIES, max_size=8),
    world_size=st.integers(min_value=1, max_value=4096),
    extra=st.dictionaries(st.text(max_size=10), _JSON, max_size=5),
)
def test_a_manifest_reads_back_as_written(files: dict[str, FileEntry], world_size: int, extra: dict) -> None:
    manifest = Manifest(files=files, world_size=world_size, library_version="0.0", extra=extra)
    text = manifest.to_json()
    assert Manifest.from_json(text) == manifest
    assert json.loads(text)["files"].keys() == files.keys()
