"""The host-memory snapshot an asynchronous ``save_state`` writes from.

Tensors are copied storage by storage (views and tied weights keep sharing memory as in the live
objects, so the files come out byte for byte as a synchronous save writes them), into host buffers
reused from one save to the next. With the overlapped copy, what the next forward/backward changes is
copied at once and the parameters and optimizer state later, by :meth:`_Snapshot.finish` in the
background, while the prepared optimizers wait to step.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar, cast, overload

import torch

import accelerando.checkpointing.files as F
import accelerando.checkpointing.save as sync
from accelerando.checkpointing.async_dcp import ShardWrites, collecting
from accelerando.checkpointing.public import save_custom_state
from accelerando.checkpointing.rng import capture_rng_states
from accelerando.checkpointing.state_io import _dataloader_state, capture_gradients, write_state_files
from accelerando.checkpointing.target import CheckpointTarget, MemorySlot
from accelerando.optimizer import AcceleratedOptimizer

if TYPE_CHECKING:
    from collections.abc import Sequence

    from torch.distributed import ProcessGroup

__all__ = ["can_overlap", "frozen_target", "snapshot_tree"]


class _Buffers:
    """Host buffers of the previous snapshot, reused in the same order by the next one.

    Copying into memory already touched costs a plain memory copy; fresh memory costs a page fault
    per page as well, several times slower. A buffer is reused only once the save that used it has
    committed (saves are one at a time).
    """

    def __init__(self) -> None:
        self.previous: list[torch.UntypedStorage] = []
        self.current: list[torch.UntypedStorage] = []

    def copy(self, storage: torch.UntypedStorage) -> torch.UntypedStorage:
        index = len(self.current)
        reused = self.previous[index] if index < len(self.previous) else None
        if reused is not None and reused.nbytes() == storage.nbytes():
            reused.copy_(storage)
            copied = reused
        else:
            copied = storage.cpu() if storage.device.type != "cpu" else storage.clone()
        self.current.append(copied)
        return copied

    def rotate(self) -> None:
        self.previous, self.current = self.current, []


_BUFFERS: MemorySlot[_Buffers] = MemorySlot("snapshot buffers", _Buffers)

_K = TypeVar("_K")
_V = TypeVar("_V")


#: Memo entry holding the source storages of a snapshot's copies (see :func:`snapshot_tree`).
_SOURCES = "sources"


def _storage_key(tensor: torch.Tensor) -> tuple[torch.device, int] | None:
    """``(device, storage address)`` of a plain strided tensor, or None (sparse, DTensor, ...)."""
    try:
        return (tensor.device, tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _memo_buffers(memo: dict[object, object]) -> _Buffers | None:
    found = memo.get("buffers")
    return found if isinstance(found, _Buffers) else None


def _sources(memo: dict[object, object]) -> list[torch.UntypedStorage]:
    held = memo.get(_SOURCES)
    if not isinstance(held, list):
        held = memo[_SOURCES] = []
    return held


@overload
def snapshot_tree(
    tree: torch.Tensor,
    memo: dict[object, object] | None = None,
    buffers: _Buffers | None = None,
    copy_if: Callable[[torch.Tensor], bool] | None = None,
) -> torch.Tensor: ...


@overload
def snapshot_tree(
    tree: dict[_K, _V],
    memo: dict[object, object] | None = None,
    buffers: _Buffers | None = None,
    copy_if: Callable[[torch.Tensor], bool] | None = None,
) -> dict[_K, _V]: ...


@overload
def snapshot_tree(
    tree: object,
    memo: dict[object, object] | None = None,
    buffers: _Buffers | None = None,
    copy_if: Callable[[torch.Tensor], bool] | None = None,
) -> object: ...


def snapshot_tree(
    tree: object,
    memo: dict[object, object] | None = None,
    buffers: _Buffers | None = None,
    copy_if: Callable[[torch.Tensor], bool] | None = None,
) -> object:
    """A copy of ``tree`` in host memory: every tensor's storage copied once, containers rebuilt.

    Tensors sharing a storage share its copy, with their offsets and strides kept, so serialising the
    copy gives the same bytes as serialising ``tree``. The memo holds each copied source storage (under
    ``"sources"``) so that no address is reused, and so mistaken for another tensor's, while it is in use. ``buffers`` supplies reusable host memory.
    With ``copy_if``, only the tensors it accepts are copied; the others are kept as they are (the
    overlapped snapshot copies parameters and optimizer state in a second pass). The copy has the
    type and structure of ``tree``.
    """
    memo = {} if memo is None else memo
    if buffers is None:
        buffers = _memo_buffers(memo)
    if isinstance(tree, torch.Tensor):
        if copy_if is not None and not copy_if(tree):
            return tree
        if tree.is_sparse or tree.layout != torch.strided:
            return tree.detach().to("cpu", copy=True)
        storage = tree.untyped_storage()
        key = (tree.device, storage.data_ptr())
        copied = memo.get(key)
        if not isinstance(copied, torch.UntypedStorage):
            if buffers is not None:
                copied = buffers.copy(storage)
            else:
                copied = storage.cpu() if storage.device.type != "cpu" else storage.clone()
            memo[key] = copied
            # The memo is keyed by address: a temporary (a generator's get_state(), a state_dict's fresh
            # tensor) freed after its copy would let the next tensor of the snapshot reuse that address
            # and be handed the temporary's copy. Holding the source keeps every address unique.
            _sources(memo).append(storage)
        out = torch.empty(0, dtype=tree.dtype)
        out.set_(copied, tree.storage_offset(), tree.size(), tree.stride())
        if isinstance(tree, torch.nn.Parameter):
            return torch.nn.Parameter(out, requires_grad=tree.requires_grad)
        return out
    if isinstance(tree, dict):
        copy = type(tree)() if type(tree) is not dict else {}
        for key, value in tree.items():
            copy[key] = snapshot_tree(value, memo, buffers, copy_if)
        return copy
    if isinstance(tree, list):
        return [snapshot_tree(value, memo, buffers, copy_if) for value in tree]
    if isinstance(tree, tuple):
        items = [snapshot_tree(value, memo, buffers, copy_if) for value in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    return tree  # numbers, strings, None...: immutable or not shared with the training


class _Stateful:
    """Stands in for an object whose state was snapshotted: ``state_dict()`` returns the copy."""

    def __init__(self, state: object) -> None:
        self._state = state

    def state_dict(self) -> object:
        return self._state


class _WithSampler:
    """Stands in for a dataloader whose sampler holds the state."""

    def __init__(self, state: object) -> None:
        self.sampler = _Stateful(state)


def _frozen_loader(loader: object, memo: dict[object, object]) -> object:
    found = _dataloader_state(loader)
    if found is None:
        return object()  # nothing to save
    stem, state = found
    state = snapshot_tree(state, memo)
    return _Stateful(state) if stem == F.DATALOADER_STATE_NAME else _WithSampler(state)


class _Frozen:
    """The checkpoint target as it was at the snapshot: the step no longer follows the training."""

    def __init__(self, target: CheckpointTarget, step: int) -> None:
        self._target = target
        self.step = step

    def __getattr__(self, name: str) -> object:
        return getattr(self._target, name)


def frozen_target(target: CheckpointTarget, step: int) -> CheckpointTarget:
    """``target`` with its step fixed at ``step`` (what an asynchronous save writes later)."""
    # _Frozen delegates every other member through __getattr__, which a type checker cannot follow.
    return cast("CheckpointTarget", _Frozen(target, step))


def _live_storages(
    models: Sequence[torch.nn.Module], optimizers: Sequence[torch.optim.Optimizer]
) -> set[tuple[torch.device, int]]:
    """Storages only an optimizer step changes: the models' parameters and the optimizers' state."""
    live: set[tuple[torch.device, int]] = set()
    tensors: list[torch.Tensor] = [p for model in models for p in model.parameters()]
    for optimizer in optimizers:
        for values in getattr(optimizer, "state", {}).values():
            tensors.extend(v for v in values.values() if isinstance(v, torch.Tensor))
    for tensor in tensors:
        key = _storage_key(tensor)
        if key is not None and key[1] != 0:
            live.add(key)
    return live


def can_overlap(target: CheckpointTarget) -> bool:
    """Whether the parameters and optimizer state may be copied while the training goes on.

    Only when there are prepared optimizers and every one can hold its ``step()`` until the copy is
    done (:class:`accelerando.optimizer.AcceleratedOptimizer`'s ``_snapshot_wait`` hook).
    """

    def holds(optimizer: object) -> bool:  # engine wrappers override step() without the hook
        return (
            isinstance(optimizer, AcceleratedOptimizer) and type(optimizer).step is AcceleratedOptimizer.step
        )

    optimizers = list(target.optimizers)
    return bool(optimizers) and all(holds(optimizer) for optimizer in optimizers)


class _Copy(Protocol):
    """Copies a state dict into the snapshot (what is not copied yet is left for :meth:`_Snapshot.finish`)."""

    def __call__(self, tree: dict[_K, _V], /) -> dict[_K, _V]: ...


class _Snapshot:
    """This process's state in host memory, and the writer of its files from that copy.

    With ``overlap``, ``weights``, ``optimizers`` and the sharded strategies' DCP state dicts still
    reference the live parameters and optimizer state after ``__init__`` (everything else is copied);
    the prepared optimizers are held, and :meth:`finish`, run first by the background thread, copies
    those and lets the optimizers step again.
    """

    def __init__(
        self, target: CheckpointTarget, plan: sync._Plan, safe_serialization: bool, overlap: bool
    ) -> None:
        buffers = target.memory.get(_BUFFERS)
        buffers.rotate()  # the previous save has committed: its buffers are free
        self._memo: dict[object, object] = {"buffers": buffers}
        self.plan, self.safe_serialization = plan, safe_serialization
        # Sharded strategies' DCP state dicts: with overlap their staging waits for the background too.
        self.shards = ShardWrites(target.memory, defer=overlap)
        self.copied = threading.Event()
        self._held: list[AcceleratedOptimizer] = []
        models = list(target.models)
        live = _live_storages(models, list(target.optimizers)) if overlap else set()
        self._live = live

        def later(tensor: torch.Tensor) -> bool:
            return _storage_key(tensor) in live

        def now(tree: dict[_K, _V]) -> dict[_K, _V]:
            return snapshot_tree(tree, self._memo, copy_if=(lambda t: not later(t)) if live else None)

        self._later = later
        with collecting(self.shards):  # sharded strategies' DCP state dicts: staged, written later
            self.weights, self.optimizers = self._models_and_optimizers(target, models, now)
        for hook in target.save_hooks:
            hook(models, self.weights, plan.staging)
        grads = None
        if sync._mid_accumulation(target) and not sync.owns_loading(target):
            grads = snapshot_tree(capture_gradients(models), self._memo)  # backward changes them: now
        self.grads = grads
        self.schedulers = [_Stateful(snapshot_tree(s.state_dict(), self._memo)) for s in target.schedulers]
        self.loaders = [_frozen_loader(loader, self._memo) for loader in target.dataloaders]
        scaler = target.scaler
        self.scaler = None if scaler is None else _Stateful(snapshot_tree(scaler.state_dict(), self._memo))
        self.custom = [_Stateful(snapshot_tree(o.state_dict(), self._memo)) for o in target.custom_objects]
        self.process_index, self.step = int(target.state.process_index), int(target.step)
        self.rng_payload: dict[str, object] = {
            "step": self.step,
            "rng": snapshot_tree(capture_rng_states(), self._memo),
        }
        # The foreground copies are done: release the temporaries they came from (the live parameters and
        # optimizer state copied by finish() were alive throughout, so no recorded address is theirs).
        self._memo.pop(_SOURCES, None)
        if overlap:
            self._hold(target.optimizers)
        else:
            self.copied.set()

    def _models_and_optimizers(
        self, target: CheckpointTarget, models: Sequence[torch.nn.Module], now: _Copy
    ) -> tuple[list[dict[str, torch.Tensor] | None], list[dict[str, object] | None]]:
        strategy, staging = target.strategy, self.plan.staging
        weights: list[dict[str, torch.Tensor] | None] = []
        for i, model in enumerate(models):
            own = strategy is not None and strategy.save_model_checkpoint(
                model, staging, i, self.safe_serialization
            )
            weights.append(None if own else now(target.get_state_dict(model)))
        optimizers: list[dict[str, object] | None] = []
        for i, optimizer in enumerate(target.optimizers):
            owner = models[i] if i < len(models) else None
            if strategy is not None and strategy.save_optimizer_checkpoint(optimizer, owner, staging, i):
                optimizers.append(None)
            else:
                optimizers.append(now(optimizer.state_dict()))
        return weights, optimizers

    def _hold(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Make every prepared optimizer's ``step()`` wait for :meth:`finish`."""
        wait = self.copied.wait
        for optimizer in optimizers:
            assert isinstance(optimizer, AcceleratedOptimizer)  # only held when can_overlap() said so
            optimizer._snapshot_wait = wait
            self._held.append(optimizer)

    def finish(self) -> None:
        """Copy the deferred parameters and optimizer state; release the held optimizers (always)."""
        try:
            self.shards.stage_deferred()
            if self._live:
                later = self._later
                memo = self._memo
                self.weights = [
                    None if w is None else snapshot_tree(w, memo, copy_if=later) for w in self.weights
                ]
                self.optimizers = [
                    None if o is None else snapshot_tree(o, memo, copy_if=later) for o in self.optimizers
                ]
        finally:
            self.copied.set()
            for optimizer in self._held:  # (saves are one at a time: no newer save holds them)
                optimizer._snapshot_wait = None  # the next steps cost one attribute read again
            self._held = []

    def write(self, on_written: Callable[[str], None], group: ProcessGroup | None) -> None:
        """Write the staged shards (collective on ``group``), then this process's own files."""
        plan, rng_name = self.plan, f"{F.RNG_STATE_NAME}_{self.process_index}.pkl"
        self.shards.write_all(group)

        def written(name: str) -> None:
            if name == rng_name:  # write_state_files captured the RNG now: put the snapshot's back
                F.torch_save(self.rng_payload, os.path.join(plan.staging, name))
            on_written(name)

        write_state_files(
            plan.staging,
            self.weights,
            [None if o is None else _Stateful(o) for o in self.optimizers],
            self.schedulers,
            self.loaders,
            self.process_index,
            self.step,
            scaler=self.scaler,
            save_on_each_node=plan.each_node,
            safe_serialization=self.safe_serialization,
            gradients=self.grads,
            on_written=written,
        )
        for i, obj in enumerate(self.custom):
            path = save_custom_state(obj, plan.staging, i, plan.each_node)
            if path is not None:
                on_written(os.path.basename(path))
