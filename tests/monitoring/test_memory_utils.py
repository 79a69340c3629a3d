"""find_executable_batch_size, release_memory and should_reduce_batch_size, with real OOM errors."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
import torch

import accelerando
from accelerando import memory_utils
from accelerando.utils.memory import find_executable_batch_size, release_memory, should_reduce_batch_size


@pytest.fixture(autouse=True)
def _collections_see_this_test_only() -> Iterator[None]:
    """Each failed try runs ``gc.collect()`` (as the reference does). In the suite's process a collection
    walks every object the earlier tests left, most of a second each; frozen first, they are skipped, and
    the collector sees what a training script's would: this test's objects (the same calls, the same
    results). ``gc.unfreeze()`` hands the earlier objects back to the collector afterwards."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


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


def _reference_sequence(start: int, threshold: int) -> list[int]:
    sizes = [start]
    while sizes[-1] > threshold:
        sizes.append(int(sizes[-1] * 0.9))
    return sizes


# Each failed try collects garbage (as the reference does), which takes a while in a big process: few tries.
@pytest.mark.parametrize(
    ("start", "threshold", "kind"),
    [(8, 1, "cpu"), (8, 3, "cuda"), (128, 100, "cpu"), (128, 115, "cuda"), (128, 128, "cpu")],
)
def test_steps_down_by_tenths_and_stops_at_first_success(start: int, threshold: int, kind: str) -> None:
    calls: list[int] = []
    finder = find_executable_batch_size(_fails_above(threshold, calls, kind), starting_batch_size=start)
    result = finder(scale=1)
    # The reference's sequence (128, 115, 103, ...); the first size that runs ends the search.
    assert calls == _reference_sequence(start, threshold)
    assert result == calls[-1] == finder.batch_size
    assert str(finder) == str(result)
    assert finder.tries == [(size, False) for size in calls[:-1]] + [(calls[-1], True)]


def test_function_completes_exactly_once() -> None:
    """The wrapped function may be a whole training loop: after one success it is never run again."""
    completed: list[int] = []

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size: int) -> int:
        if batch_size > 52:
            raise RuntimeError("CPU out of memory.")
        completed.append(batch_size)
        return batch_size

    assert train() == 51  # 64, 57, 51
    assert completed == [51]
    assert train() == 51  # a second call searches again from the start, and again completes once
    assert completed == [51, 51]


def test_start_below_threshold_keeps_reference_contract() -> None:
    calls: list[int] = []
    finder = find_executable_batch_size(_fails_above(100, calls), starting_batch_size=16)
    assert finder() == 16
    assert calls == [16]


def test_decorator_form_passes_arguments() -> None:
    calls: list[int] = []

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size: int, a: int, b: int = 0) -> tuple[int, int, int]:
        calls.append(batch_size)
        if batch_size > 52:
            _real_cpu_oom(batch_size)
        return batch_size, a, b

    assert train(1, b=2) == (51, 1, 2)  # 64, 57, 51
    assert train.batch_size == 51
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

    with pytest.raises(RuntimeError, match="No executable batch size found, reached zero."):
        find_executable_batch_size(train, 3)()
    with pytest.raises(RuntimeError, match="reached zero"):
        find_executable_batch_size(train, 0)()


def test_passing_batch_size_explicitly_is_a_type_error() -> None:
    def train(batch_size: int, arg1: str) -> None: ...

    finder = find_executable_batch_size(train, 8)
    with pytest.raises(TypeError, match=r"Batch size was passed into `train`.*`train\(arg1='hello'\)`"):
        finder(8, "hello")


def test_custom_reduce_fn_is_followed() -> None:
    calls: list[int] = []
    finder = find_executable_batch_size(
        _fails_above(50, calls), starting_batch_size=100, reduce_batch_size_fn=lambda size: size - 20
    )
    assert finder() == 40
    assert calls == [100, 80, 60, 40]
    # the reference's form: a policy without arguments, asked for the next size after each failure
    sizes = iter([30, 10])
    calls.clear()
    finder = find_executable_batch_size(
        _fails_above(20, calls), starting_batch_size=100, reduce_batch_size_fn=lambda: next(sizes)
    )
    assert finder() == 10
    assert calls == [100, 30, 10]


def test_invalid_arguments() -> None:
    with pytest.raises(TypeError, match="starting_batch_size"):
        find_executable_batch_size(lambda b: b, 1.5)
    with pytest.raises(TypeError, match="callable"):
        find_executable_batch_size(3)
    finder = find_executable_batch_size(_fails_above(0, []), 64, reduce_batch_size_fn=lambda size: "half")
    with pytest.raises(TypeError, match="must return an int"):
        finder()


def test_should_reduce_batch_size() -> None:
    try:
        _real_cpu_oom(2)
    except RuntimeError as exc:
        assert should_reduce_batch_size(exc)
    assert should_reduce_batch_size(torch.OutOfMemoryError("CUDA out of memory."))
    assert should_reduce_batch_size(RuntimeError("XPU out of memory. Tried"))
    assert should_reduce_batch_size(RuntimeError("CPU out of memory."))
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
