"""The simulator's work does not grow with the world size it simulates (counted, not timed).

FSDP2 cut every parameter into one chunk per rank and the device mesh made one process group per rank
for each dimension of size 1; at 4,096 simulated ranks that was minutes of fake-tensor operations. The
simulator now makes only the chunks the simulated rank reads and leaves size-1 mesh dimensions out;
these tests count the fake-tensor operations and process groups of laying a model out at 8 and at
4,096 ranks, and check the chunks are the ones torch would have made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
from planning_toy import ToyLM
from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode

from accelerando.backends.planning.layouts import _LazyChunks, apply_layout, build_mesh, one_rank_chunks
from accelerando.backends.planning.spec import Candidate, TrainingShape

SHAPE = TrainingShape(micro_batch=2, seq_length=16, mixed_precision="no")


class _OpCounter(TorchDispatchMode):
    """Counts the aten operations dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(
        self,
        func: Callable[..., object],
        types: object,
        args: tuple[object, ...] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        self.ops += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def fake_group() -> Iterator[Callable[[int], None]]:
    """Starts the fake process group at a world size; destroys it after the test."""

    def start(world: int) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


def _layout_work(
    world: int, candidate: Candidate, start: Callable[[int], None], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, int]:
    """(``new_group`` calls of the mesh, fake-tensor operations of building and sharding the toy model)."""
    import torch.distributed.device_mesh as device_mesh
    from torch._subclasses.fake_tensor import FakeTensorMode

    start(world)
    calls: list[object] = []
    from torch.distributed.distributed_c10d import new_group as original

    def new_group(*args: object, **kwargs: object) -> object:
        calls.append(kwargs.get("ranks"))
        return original(*args, **kwargs)  # pyright: ignore[reportArgumentType]

    monkeypatch.setattr(device_mesh, "new_group", new_group)
    mesh = build_mesh(candidate)
    monkeypatch.setattr(device_mesh, "new_group", original)
    with FakeTensorMode(allow_non_fake_inputs=True), one_rank_chunks(), _OpCounter() as counter:
        model = ToyLM()
        apply_layout(model, candidate, SHAPE, mesh, wrap_ddp=False)
    return len(calls), counter.ops


def test_fully_sharding_at_4096_ranks_costs_what_it_costs_at_8(
    fake_group: Callable[[int], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    small = _layout_work(8, Candidate("fsdp2", dp_shard=8, zero_stage=3), fake_group, monkeypatch)
    large = _layout_work(4096, Candidate("fsdp2", dp_shard=4096, zero_stage=3), fake_group, monkeypatch)
    assert large == small
    groups, ops = small
    assert groups == 0  # the mesh's one dimension is the default group (before: 2 x 4,096 + 1 new groups)
    assert ops < 1000  # building the toy (10 parameters) and two chunks per parameter


def test_hybrid_sharding_operations_do_not_grow_with_the_world_size(
    fake_group: Callable[[int], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    small = _layout_work(
        8, Candidate("hsdp", dp_shard=4, dp_replicate=2, zero_stage=3), fake_group, monkeypatch
    )
    large = _layout_work(
        4096, Candidate("hsdp", dp_shard=8, dp_replicate=512, zero_stage=3), fake_group, monkeypatch
    )
    assert large[1] == small[1]
    # one group per shard group and per replica group (a mesh's groups), not per rank and dimension
    assert large[0] == 4096 // 8 + 4096 // 512


@pytest.mark.parametrize(("rows", "chunks"), [(10, 4), (3, 8), (64, 64), (5, 4096), (1, 2)])
def test_the_lazy_chunks_are_the_views_fsdp2_would_have_made(rows: int, chunks: int) -> None:
    tensor = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3)
    eager = _chunk_with_empty(tensor, chunks, dim=0)
    lazy = _LazyChunks(tensor, chunks, dim=0)
    assert len(lazy) == len(eager) == chunks
    for index in {0, 1 % chunks, chunks // 2, chunks - 1, -1}:
        made, expected = lazy[index], eager[index]
        assert made.shape == expected.shape and made.stride() == expected.stride()
        assert made.storage_offset() == expected.storage_offset()
        assert torch.equal(made, expected)
    assert [t.shape for t in lazy[1:3]] == [t.shape for t in eager[1:3]]
    with pytest.raises(IndexError):
        lazy[chunks]
