"""find_executable_batch_size, release_memory and should_reduce_batch_size, with real OOM errors."""

from __future__ import annotations

import gc
import math
import weakref

import pytest
import torch

import accelerando
from accelerando import memory_utils
from accelerando.utils.memory import find_executable_batch_size, release_memory, should_reduce_batch_size


def _real_cpu_oom(batch_size: int) -> None:
    # 16 TiB per sample cannot be allocated here: the CPU allocator raises at once.
    torch.empty(batch_size, 1 << 44, dtype=torch.uint8)


def _fails_above(threshold: int, calls: list[int], kind: str = "cpu"):
    def train(batch_size: int, scale: int = 1) -> int:
        calls.append(batch_size)
        if batch_size > threshold:
            if kind == "cpu":
                _real_cpu_oom(batch_size)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return batch_size * scale

    return train


@pytest.mark.parametrize(
    ("threshold", "kind"),
    [(1, "cpu"), (3, "cuda"), (37, "cpu"), (64, "cuda"), (65, "cpu"), (127, "cuda"), (128, "cpu")],
)
def test_finds_exact_threshold_from_above_in_log_tries(threshold: int, kind: str) -> None:
    calls: list[int] = []
    finder = find_executable_batch_size(_fails_above(threshold, calls, kind), starting_batch_size=128)
    assert finder(scale=1) == threshold
    assert finder.batch_size == threshold
    assert str(finder) == str(threshold)
    # halving to the first success, then bisecting: at most 2 * log2(start) + 1 tries
    assert len(calls) <= 2 * math.ceil(math.log2(128)) + 1
    assert [size for size, _ in finder.tries] == calls
    assert max(size for size, ok in finder.tries if ok) == threshold


@pytest.mark.parametrize("threshold", [9, 1000])
def test_grows_from_below_when_max_batch_size_given(threshold: int) -> None:
    calls: list[int] = []
    finder = find_executable_batch_size(
        _fails_above(threshold, calls), starting_batch_size=8, max_batch_size=4096
    )
    assert finder() == threshold
    assert len(calls) <= 2 * math.ceil(math.log2(4096)) + 1


def test_start_below_threshold_without_max_keeps_reference_contract() -> None:
    calls: list[int] = []
    finder = find_executable_batch_size(_fails_above(100, calls), starting_batch_size=16)
    assert finder() == 16
    assert calls == [16]


def test_decorator_form_passes_arguments() -> None:
    calls: list[int] = []

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size: int, a: int, b: int = 0) -> tuple[int, int, int]:
        calls.append(batch_size)
        if batch_size > 20:
            _real_cpu_oom(batch_size)
        return batch_size, a, b

    assert train(1, b=2) == (20, 1, 2)
    assert train.batch_size == 20
    assert train.__name__ == "train"


def test_non_oom_error_propagates_unchanged() -> None:
    error = ValueError("bad data")
    calls: list[int] = []

    def train(batch_size: int) -> None:
        calls.append(batch_size)
        raise error

    with pytest.raises(ValueError) as info:
        find_executable_batch_size(train, 128)()
    assert info.value is error
    assert calls == [128]


def test_reaching_zero_raises_clear_error() -> None:
    def train(batch_size: int) -> None:
        _real_cpu_oom(batch_size)

    with pytest.raises(RuntimeError, match="no executable batch size found"):
        find_executable_batch_size(train, 16)()


def test_passing_batch_size_explicitly_is_a_type_error() -> None:
    finder = find_executable_batch_size(lambda batch_size: batch_size, 8)
    with pytest.raises(TypeError, match="batch size"):
        finder(8)


def test_custom_reduce_fn_is_followed() -> None:
    calls: list[int] = []
    finder = find_executable_batch_size(
        _fails_above(50, calls), starting_batch_size=100, reduce_batch_size_fn=lambda size: size - 20
    )
    assert finder() == 40
    assert calls == [100, 80, 60, 40]


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="starting_batch_size"):
        find_executable_batch_size(lambda b: b, 0)
    with pytest.raises(ValueError, match="max_batch_size"):
        find_executable_batch_size(lambda b: b, 64, max_batch_size=8)


def test_should_reduce_batch_size() -> None:
    try:
        _real_cpu_oom(2)
    except RuntimeError as exc:
        assert should_reduce_batch_size(exc)
    assert should_reduce_batch_size(torch.OutOfMemoryError("CUDA out of memory."))
    assert should_reduce_batch_size(RuntimeError("XPU out of memory. Tried"))
    assert should_reduce_batch_size(MemoryError())
    assert not should_reduce_batch_size(RuntimeError("shape mismatch"))
    assert not should_reduce_batch_size(ValueError("CUDA out of memory."))


def test_release_memory_frees_objects() -> None:
    model = torch.nn.Linear(4, 4)
    ref = weakref.ref(model)
    model, other = release_memory(model, [1, 2])
    assert model is None and other is None
    gc.collect()
    assert ref() is None


def test_public_paths() -> None:
    assert memory_utils.find_executable_batch_size is find_executable_batch_size
    assert accelerando.find_executable_batch_size is find_executable_batch_size
    from accelerando.utils import release_memory as public_release

    assert public_release is release_memory
