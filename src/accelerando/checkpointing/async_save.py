"""``save_state(async_save=True)``: snapshot in the foreground, write and commit in the background.

The foreground part runs on every process, in the training's thread, and is all the training waits
for: the committing process claims the folder (the same step 1 as a synchronous save, so the same
locking and numbering), then every process copies its state into host memory (weights, optimizer,
scheduler, dataloader, scaler and custom-object states, its random states, the step, gradients of an
unfinished accumulation cycle). Tensors are copied storage by storage, so views and tied weights keep
sharing memory exactly as in the live objects and the files come out byte for byte as a synchronous
save writes them.

A background thread per process then runs steps 2 and 3 of :mod:`accelerando.checkpointing.save`
unchanged on the snapshot: write into the hidden staging folder, flush and hash, gather every
process's outcome, write the manifest, rename into place, rotate. Its gathers go through a gloo process
group of its own (made once, collectively, by the first asynchronous save), so they never interleave
with the training's collectives. A crash before the rename leaves only a hidden staging folder (the
previous checkpoint stays the newest); the next save cleans it up.

The next ``save_state``, ``Accelerator.load_state`` and the end of the process wait for a pending
save; its error, if any, is raised there (or by :meth:`AsyncSaveHandle.result`).

Strategies that write their own sharded files (FSDP, DeepSpeed) write them in the foreground: their
files are produced by collectives of the training's own process group (torch.distributed.checkpoint
for FSDP), which a background thread must not run concurrently with training; the rest of the
checkpoint is still written in the background.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch

import accelerando.checkpointing.files as F
import accelerando.checkpointing.save as sync
from accelerando.checkpointing.public import save_custom_state
from accelerando.checkpointing.rng import capture_rng_states
from accelerando.checkpointing.state_io import _dataloader_state, capture_gradients, write_state_files
from accelerando.runtime import set_active_accelerator

__all__ = ["AsyncSaveHandle", "save_state_async", "snapshot_tree", "wait_pending"]

logger = logging.getLogger(__name__)

# The pending save of each Accelerator (weakly: the Accelerator may be collected).
_PENDING: weakref.WeakKeyDictionary[Any, AsyncSaveHandle] = weakref.WeakKeyDictionary()
# Every handle not yet waited for, for the wait at interpreter exit.
_UNWAITED: set[AsyncSaveHandle] = set()
_UNWAITED_LOCK = threading.Lock()
# The background gathers' process group, per default process group (made once, collectively).
_GROUPS: dict[int, Any] = {}


class AsyncSaveHandle:
    """A checkpoint being written in the background; ``result()`` waits for its commit.

    Attributes:
        path: The folder the checkpoint will have once committed.
    """

    def __init__(self, path: str, report: Callable[[], None]) -> None:
        self.path = path
        self._report = report
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._reported = False
        self._owner: Any = None

    def _start(self, work: Callable[[], None]) -> None:
        def run() -> None:
            try:
                work()
            except BaseException as err:  # noqa: BLE001 - handed to result() in the caller's thread
                self._error = err

        self._thread = threading.Thread(target=run, name="accelerando-async-save", daemon=True)
        with _UNWAITED_LOCK:
            _UNWAITED.add(self)
        self._thread.start()

    def done(self) -> bool:
        """Whether the background write has ended (committed or failed)."""
        return self._thread is None or not self._thread.is_alive()

    def result(self, timeout: float | None = None) -> str:
        """Wait for the commit and return the checkpoint folder.

        Args:
            timeout: Seconds to wait at most (None: until done).

        Raises:
            TimeoutError: If ``timeout`` passed first.
            OSError, CheckpointError, CheckpointLockedError: What the save raised (as ``save_state``
                does synchronously); nothing was committed then and earlier checkpoints are untouched.
        """
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the asynchronous save of {self.path!r} is still being written")
        with _UNWAITED_LOCK:
            _UNWAITED.discard(self)
        owner = self._owner() if self._owner is not None else None
        if owner is not None and _PENDING.get(owner) is self:
            del _PENDING[owner]  # waited for: its error is raised here, once
        if self._error is not None:
            raise self._error
        if not self._reported:
            self._reported = True
            self._report()
        return self.path

    def __repr__(self) -> str:
        state = "pending" if not self.done() else "failed" if self._error is not None else "committed"
        return f"AsyncSaveHandle({self.path!r}, {state})"


def wait_pending(owner: Any) -> None:
    """Wait for ``owner``'s pending asynchronous save, if any (raising its error).

    Raises:
        What the pending save raised.
    """
    handle = _PENDING.pop(owner, None)
    if handle is not None:
        handle.result()


@atexit.register
def _wait_all_at_exit() -> None:
    with _UNWAITED_LOCK:
        handles = list(_UNWAITED)
    for handle in handles:
        try:
            handle.result()
        except BaseException as err:  # noqa: BLE001 - the process is ending: say it, do not mask the exit
            logger.error("asynchronous checkpoint %s was not committed: %s", handle.path, err)


# ---------------------------------------------------------------------------------- the snapshot
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


_BUFFERS: weakref.WeakKeyDictionary[Any, _Buffers] = weakref.WeakKeyDictionary()


def snapshot_tree(tree: Any, memo: dict[Any, Any] | None = None, buffers: _Buffers | None = None) -> Any:
    """A copy of ``tree`` in host memory: every tensor's storage copied once, containers rebuilt.

    Tensors sharing a storage share its copy, with their offsets and strides kept, so serialising the
    copy gives the same bytes as serialising ``tree``. ``buffers`` supplies reusable host memory.
    """
    memo = {} if memo is None else memo
    if buffers is None:
        buffers = memo.get("buffers")
    if isinstance(tree, torch.Tensor):
        if tree.is_sparse or tree.layout != torch.strided:
            return tree.detach().to("cpu", copy=True)
        storage = tree.untyped_storage()
        key = (tree.device, storage.data_ptr())
        copied = memo.get(key)
        if copied is None:
            if buffers is not None:
                copied = buffers.copy(storage)
            else:
                copied = storage.cpu() if storage.device.type != "cpu" else storage.clone()
            memo[key] = copied
        out = torch.empty(0, dtype=tree.dtype)
        out.set_(copied, tree.storage_offset(), tree.size(), tree.stride())
        if isinstance(tree, torch.nn.Parameter):
            return torch.nn.Parameter(out, requires_grad=tree.requires_grad)
        return out
    if isinstance(tree, dict):
        copy = type(tree)() if type(tree) is not dict else {}
        for key, value in tree.items():
            copy[key] = snapshot_tree(value, memo)
        return copy
    if isinstance(tree, list):
        return [snapshot_tree(value, memo) for value in tree]
    if isinstance(tree, tuple):
        items = [snapshot_tree(value, memo) for value in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    return tree  # numbers, strings, None...: immutable or not shared with the training


class _Stateful:
    """Stands in for an object whose state was snapshotted: ``state_dict()`` returns the copy."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def state_dict(self) -> Any:
        return self._state


class _WithSampler:
    """Stands in for a dataloader whose sampler holds the state."""

    def __init__(self, state: Any) -> None:
        self.sampler = _Stateful(state)


def _frozen_loader(loader: Any, memo: dict[Any, Any]) -> Any:
    found = _dataloader_state(loader)
    if found is None:
        return object()  # nothing to save
    stem, state = found
    state = snapshot_tree(state, memo)
    return _Stateful(state) if stem == F.DATALOADER_STATE_NAME else _WithSampler(state)


class _Frozen:
    """The checkpoint target as it was at the snapshot: the step no longer follows the training."""

    def __init__(self, target: Any, step: int) -> None:
        self._target = target
        self.step = step

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def _snapshot_writer(
    target: Any, plan: Any, safe_serialization: bool
) -> Callable[[Callable[[str], None]], None]:
    """Copy this process's state to host memory now; return the writer of its files from that copy."""
    buffers = _BUFFERS.setdefault(target.owner, _Buffers())
    buffers.rotate()  # the previous save has committed: its buffers are free
    memo: dict[Any, Any] = {"buffers": buffers}
    models = list(target.models)
    optimizers: list[Any] = list(target.optimizers)
    strategy = target.strategy
    weights: list[Any] = []
    for i, model in enumerate(models):
        own = strategy is not None and strategy.save_model_checkpoint(
            model, plan.staging, i, safe_serialization
        )
        weights.append(None if own else snapshot_tree(target.get_state_dict(model), memo))
    for i, optimizer in enumerate(optimizers):
        owner = models[i] if i < len(models) else None
        if strategy is not None and strategy.save_optimizer_checkpoint(optimizer, owner, plan.staging, i):
            optimizers[i] = None
        else:
            optimizers[i] = _Stateful(snapshot_tree(optimizer.state_dict(), memo))
    for hook in target.save_hooks:
        hook(models, weights, plan.staging)
    grads = None
    if sync._mid_accumulation(target) and not sync.owns_loading(target):
        grads = snapshot_tree(capture_gradients(models), memo)
    schedulers = [_Stateful(snapshot_tree(s.state_dict(), memo)) for s in target.schedulers]
    loaders = [_frozen_loader(loader, memo) for loader in target.dataloaders]
    scaler = target.scaler
    scaler = None if scaler is None else _Stateful(snapshot_tree(scaler.state_dict(), memo))
    custom = [_Stateful(snapshot_tree(obj.state_dict(), memo)) for obj in target.custom_objects]
    process_index, step = int(target.state.process_index), int(target.step)
    rng_name = f"{F.RNG_STATE_NAME}_{process_index}.pkl"
    rng_payload = {"step": step, "rng": snapshot_tree(capture_rng_states(), memo)}

    def write(on_written: Callable[[str], None]) -> None:
        def written(name: str) -> None:
            if name == rng_name:  # write_state_files captured the RNG now: put the snapshot's back
                F.torch_save(rng_payload, os.path.join(plan.staging, name))
            on_written(name)

        write_state_files(
            plan.staging,
            weights,
            optimizers,
            schedulers,
            loaders,
            process_index,
            step,
            scaler=scaler,
            save_on_each_node=plan.each_node,
            safe_serialization=safe_serialization,
            gradients=grads,
            on_written=written,
        )
        for i, obj in enumerate(custom):
            path = save_custom_state(obj, plan.staging, i, plan.each_node)
            if path is not None:
                on_written(os.path.basename(path))

    return write


# --------------------------------------------------------------------------- background gathers
def _exchange_for(target: Any) -> Callable[[Any, int], list[Any]]:
    """The all-gather the background thread uses: on a gloo group of its own (collective, once)."""
    import torch.distributed as dist

    if target.state.num_processes <= 1 or not (dist.is_available() and dist.is_initialized()):
        return sync.gather
    default = dist.distributed_c10d._get_default_group()
    group = _GROUPS.get(id(default))
    if group is None:
        group = dist.new_group(backend="gloo")
        _GROUPS[id(default)] = group

    def exchange(obj: Any, num_processes: int) -> list[Any]:
        out: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(out, obj, group=group)
        return out

    return exchange


def save_state_async(
    target: Any, output_dir: str | os.PathLike | None, safe_serialization: bool, wait_for_lock: float
) -> AsyncSaveHandle:
    """Start an asynchronous ``save_state``; return once the state is copied to host memory.

    Every process must call it (as ``save_state``). What is saved, where and how it is committed is
    exactly what :func:`accelerando.checkpointing.save_state` does; only the writing and the
    commit happen in a background thread.

    Args:
        target: what to save (the Accelerator's checkpoint target).
        output_dir: see ``save_state``.
        safe_serialization: weights as safetensors.
        wait_for_lock: seconds to wait for another run's lock on the folder.

    Returns:
        The handle; ``result()`` waits for the commit and returns the folder (raising the save's error).

    Raises:
        ValueError, CheckpointLockedError, OSError: as ``save_state``, for what is decided before the
            background write (the folder, the lock).
    """
    set_active_accelerator(target.owner)
    exchange = _exchange_for(target)
    stack = ExitStack()  # an explicit folder's save lock: held until the background commit is done
    try:
        plan = sync._plan_everywhere(target, stack, output_dir, wait_for_lock)
    except BaseException:
        stack.close()
        raise
    try:
        write = _snapshot_writer(target, plan, safe_serialization)
    except Exception as err:  # noqa: BLE001 - every process learns of it in the background's gather
        failure = err

        def write(on_written: Callable[[str], None]) -> None:
            raise failure

    frozen = _Frozen(target, int(target.step))
    number = sync._number(plan.final_dir)
    if plan.checkpoints_dir is not None and number is not None:
        sync._run(target).last_saved = number  # the next save takes the next number, as after a sync one
        target.project_configuration.iteration = number + 1

    sizes: list[int] = []

    def work() -> None:
        with stack:
            results = sync._write_everywhere(frozen, plan, safe_serialization, write, exchange)
            sizes.append(sync._commit_everywhere(frozen, plan, results, exchange))

    handle = AsyncSaveHandle(
        plan.final_dir, lambda: sync._report_to_trackers(frozen, plan.final_dir, sizes[0] if sizes else 0)
    )
    _PENDING[target.owner] = handle
    handle._owner = weakref.ref(target.owner)
    handle._start(work)
    return handle
