"""Sharded (``torch.distributed.checkpoint``) files of an asynchronous save: staged now, written later.

Strategies that write per-process shards (FSDP with SHARDED_STATE_DICT, the composable TP/FSDP2
strategy) call :func:`save_or_stage` instead of ``dcp.save``. Outside an asynchronous save it is
``dcp.save``. During the foreground part of ``save_state(async_save=True)``
(:func:`accelerando.checkpointing.async_save.save_state_async` activates a :class:`ShardWrites` with
:func:`collecting`), the state dict is only *staged*: copied to host memory by DCP's own stager
(``torch.distributed.checkpoint.staging.DefaultStager``, the staging ``dcp.async_save`` uses; it keeps
its host copies between saves and refreshes them in place). The background thread later writes every
staged state dict with ``dcp.save`` into the checkpoint's hidden staging folder, on the background's
own gloo process group, one after the other and before the rest of the commit protocol; so DCP's
collectives never run concurrently with the training's, nor with each other, and the manifest and
rename happen only once DCP has finished on every process.

Why not ``dcp.async_save`` itself: it runs each save in an executor thread of its own, so a model's and
an optimizer's save would run their collectives concurrently on one group (their order could differ
between processes), and its completion is a future the commit would have to chain onto. Staging with
DCP's stager and writing from the one background thread is the same work in a fixed order.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, overload

from accelerando.checkpointing.target import CheckpointMemory, MemorySlot

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.checkpoint.staging import DefaultStager

__all__ = ["ShardWrites", "collecting", "save_or_stage"]

_ACTIVE = threading.local()  # .writes: the ShardWrites of the save being snapshotted by this thread


def _new_stager() -> DefaultStager:
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    # Plain host memory, copied in the calling thread (the training waits for exactly this).
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=False,
            use_shared_memory=False,
            use_async_staging=False,
            use_non_blocking_copy=False,
        )
    )


# One DCP stager per Accelerator: its host copies are reused (refreshed in place) by the next save.
_STAGER: MemorySlot[DefaultStager] = MemorySlot("DCP stager", _new_stager)


class ShardWrites:
    """The DCP state dicts one asynchronous save staged, in the order the strategy produced them.

    Args:
        memory: the Accelerator's checkpoint memory (its stager's host copies are reused across saves).
    """

    def __init__(self, memory: CheckpointMemory, defer: bool = False) -> None:
        self._memory = memory
        self._defer = defer
        self._live: list[tuple[dict[str, object], str]] = []
        self.pending: list[tuple[dict[str, object], str]] = []

    def stage(self, state_dict: dict[str, object], folder: str) -> None:
        """Copy ``state_dict`` (DTensors included) to host memory; write it into ``folder`` later.

        With ``defer`` (an overlapped snapshot) only the references are kept here;
        :meth:`stage_deferred`, run by the background thread before the optimizers may step again,
        copies them.
        """
        if self._defer:
            self._live.append((state_dict, folder))
            return
        self._stage_now(state_dict, folder)

    def stage_deferred(self) -> None:
        """Copy the state dicts :meth:`stage` deferred (the training's optimizer steps wait for this)."""
        live, self._live = self._live, []
        for state_dict, folder in live:
            self._stage_now(state_dict, folder)

    def _stage_now(self, state_dict: dict[str, object], folder: str) -> None:
        # DCP's stager cannot copy FSDP1's ShardedTensors: they are copied here, the rest by the stager.
        sharded: list[object] = []
        plain = _set_aside(state_dict, sharded)
        staged = self._memory.get(_STAGER).stage(plain)
        # Staged in this thread (use_async_staging=False): a state dict, never a future.
        assert isinstance(staged, dict)
        self.pending.append((_put_back(staged, sharded), folder))

    def write_all(self, process_group: ProcessGroup | None) -> list[str]:
        """Write every staged state dict with ``dcp.save`` (collective on ``process_group``).

        Every process must call it with the same pending list (the strategy staged the same folders
        everywhere). Returns the folders written.

        Raises:
            What ``dcp.save`` raised (``CheckpointException`` names the failed processes).
        """
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        written = []
        pending, self.pending = self.pending, []
        for staged, folder in pending:
            dcp_save(staged, checkpoint_id=folder, process_group=process_group)
            written.append(folder)
        return written


class _Slot:
    """Where a ShardedTensor was, while the rest of the state dict goes through DCP's stager."""

    def __init__(self, index: int) -> None:
        self.index = index


@overload
def _set_aside(tree: dict[str, object], sharded: list[object]) -> dict[str, object]: ...


@overload
def _set_aside(tree: object, sharded: list[object]) -> object: ...


def _set_aside(tree: object, sharded: list[object]) -> object:
    """``tree`` with each ShardedTensor replaced by a :class:`_Slot`, its host copy appended to ``sharded``."""
    # torch 2.13: torch/distributed/_shard/sharded_tensor/api.py:194 (private; in FSDP1's sharded state dicts)
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor

    # torch 2.13: torch/distributed/_shard/sharded_tensor/shard.py:8 (private; a ShardedTensor's local shard)
    from torch.distributed._shard.sharded_tensor.shard import Shard

    if isinstance(tree, ShardedTensor):
        shards = [Shard(s.tensor.detach().to("cpu", copy=True), s.metadata) for s in tree.local_shards()]
        copy = ShardedTensor._init_from_local_shards_and_global_metadata(
            shards, tree.metadata(), process_group=tree._process_group
        )
        sharded.append(copy)
        return _Slot(len(sharded) - 1)
    if isinstance(tree, dict):
        return type(tree)((key, _set_aside(value, sharded)) for key, value in tree.items())
    if isinstance(tree, list):
        return [_set_aside(value, sharded) for value in tree]
    return tree


@overload
def _put_back(tree: dict[str, object], sharded: list[object]) -> dict[str, object]: ...


@overload
def _put_back(tree: object, sharded: list[object]) -> object: ...


def _put_back(tree: object, sharded: list[object]) -> object:
    if not sharded:
        return tree
    if isinstance(tree, _Slot):
        return sharded[tree.index]
    if isinstance(tree, dict):
        return type(tree)((key, _put_back(value, sharded)) for key, value in tree.items())
    if isinstance(tree, list):
        return [_put_back(value, sharded) for value in tree]
    return tree


@contextmanager
def collecting(writes: ShardWrites) -> Iterator[ShardWrites]:
    """While active in this thread, :func:`save_or_stage` stages into ``writes`` instead of writing."""
    previous = getattr(_ACTIVE, "writes", None)
    _ACTIVE.writes = writes
    try:
        yield writes
    finally:
        _ACTIVE.writes = previous


def save_or_stage(state_dict: dict[str, object], folder: str | os.PathLike) -> None:
    """Write ``state_dict`` as a DCP folder now, or stage it for the asynchronous save in progress.

    Every process calls it (it is collective, as ``dcp.save``).

    Raises:
        What ``dcp.save`` raises (synchronous case).
    """
    writes = getattr(_ACTIVE, "writes", None)
    if writes is not None:
        writes.stage(state_dict, os.fspath(folder))
        return
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    dcp_save(state_dict, checkpoint_id=os.fspath(folder))
