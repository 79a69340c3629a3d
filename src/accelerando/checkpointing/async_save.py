"""``save_state(async_save=True)``: snapshot in the foreground, write and commit in the background.

The foreground part runs on every process, in the training's thread, and is all the training waits
for: the committing process claims the folder (the same step 1 as a synchronous save, so the same
locking and numbering), then every process copies into host memory what the next forward and
backward change: scheduler, dataloader, scaler and custom-object states, its random states, the
step, model buffers, gradients of an unfinished accumulation cycle. Tensors are copied storage by
storage, so views and tied weights keep sharing memory exactly as in the live objects and the files
come out byte for byte as a synchronous save writes them.

The parameters and optimizer state change only in the optimizer step, so (``overlap``, the default
when every prepared optimizer is an :class:`~accelerando.optimizer.AcceleratedOptimizer`) they are
copied by the background thread while the next forward and backward run; the prepared optimizers'
``step()`` (and schedule-free ``train()``/``eval()``) wait for that copy through their
``_snapshot_wait`` hook, which is None, one attribute read, when no copy is pending. The contract:
until that step, parameters change only through the prepared optimizers. ``overlap_snapshot=False``
copies everything in the foreground instead.

Sharded strategies (FSDP ``SHARDED_STATE_DICT``, the composable strategy) hand their
``torch.distributed.checkpoint`` state dicts to :mod:`accelerando.checkpointing.async_dcp`: staged to
host memory with DCP's stager (in the background with overlap, else in the foreground) and written by
``dcp.save`` from the background thread, before the rest of the files. DeepSpeed engines and FSDP's
gathered full optimizer state are still written in the foreground.

A background thread per process then runs steps 2 and 3 of :mod:`accelerando.checkpointing.save`
unchanged on the snapshot: write into the hidden staging folder, flush and hash, gather every
process's outcome, write the manifest, rename into place, rotate. Its gathers and DCP's collectives go
through a gloo process group of its own (made once, collectively, by the first asynchronous save), so
they never interleave with the training's collectives. A crash before the rename leaves only a hidden
staging folder (the previous checkpoint stays the newest); the next save cleans it up.

The next ``save_state``, ``Accelerator.load_state`` and the end of the process wait for a pending
save; its error, if any, is raised there (or by :meth:`AsyncSaveHandle.result`).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from contextlib import ExitStack
from typing import TYPE_CHECKING, TypeVar

import accelerando.checkpointing.atomic as atomic
import accelerando.checkpointing.save as sync
from accelerando.checkpointing.snapshot import _Snapshot, can_overlap, frozen_target, snapshot_tree
from accelerando.checkpointing.target import CheckpointMemory, CheckpointTarget
from accelerando.core.runtime import set_active_accelerator

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from accelerando.checkpointing.collective import Exchange

__all__ = ["AsyncSaveHandle", "can_overlap", "save_state_async", "snapshot_tree", "wait_pending"]

logger = logging.getLogger(__name__)

# Every handle not yet waited for, for the wait at interpreter exit.
_UNWAITED: set[AsyncSaveHandle] = set()
_UNWAITED_LOCK = threading.Lock()
# CPU priority (nice value) of the background thread once its copy is done: writing, hashing and
# syncing then yield the CPU to the training (Linux only, where a nice value is per thread; the
# helper threads it starts inherit it). The copy itself runs at the training's priority, since an
# optimizer step may be waiting for it. 0 keeps the training's priority.
BACKGROUND_NICE = 10
# The background's gloo process group and the default group it was made for (made once, collectively).
_GROUPS: dict[str, tuple[ProcessGroup, ProcessGroup]] = {}

_T = TypeVar("_T")


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
        self._memory: weakref.ref[CheckpointMemory] | None = None

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
        memory = self._memory() if self._memory is not None else None
        if memory is not None and memory.pending is self:
            memory.pending = None  # waited for: its error is raised here, once
        if self._error is not None:
            raise self._error
        if not self._reported:
            self._reported = True
            self._report()
        return self.path

    def __repr__(self) -> str:
        state = "pending" if not self.done() else "failed" if self._error is not None else "committed"
        return f"AsyncSaveHandle({self.path!r}, {state})"


def wait_pending(memory: CheckpointMemory) -> None:
    """Wait for the pending asynchronous save of the Accelerator whose ``memory`` this is, if any.

    Raises:
        What the pending save raised.
    """
    handle, memory.pending = memory.pending, None
    if handle is not None:
        handle.result()


def _wait_all_at_exit() -> None:
    with _UNWAITED_LOCK:
        handles = list(_UNWAITED)
    for handle in handles:
        try:
            handle.result()
        except BaseException as err:  # noqa: BLE001 - the process is ending: say it, do not mask the exit
            logger.error("asynchronous checkpoint %s was not committed: %s", handle.path, err)


_EXIT_HOOKED: list[bool] = []


def _hook_exit() -> None:
    """Make the end of the process wait for pending saves, early enough for them to finish.

    ``concurrent.futures`` refuses new work once the interpreter starts shutting down (its own hook
    in ``threading``'s shutdown, which runs before ``atexit``), and the background write hashes files
    on such a pool: so the wait is hooked there too, after it (hooks run newest first). The ``atexit``
    hook is registered again each time so that it runs before the process group's teardown.
    """
    if not _EXIT_HOOKED:
        register = getattr(threading, "_register_atexit", None)
        if register is not None:
            try:
                register(_wait_all_at_exit)
            except RuntimeError:  # already shutting down
                pass
        _EXIT_HOOKED.append(True)
    atexit.unregister(_wait_all_at_exit)
    atexit.register(_wait_all_at_exit)


# --------------------------------------------------------------------------- background gathers
def _background_group(target: CheckpointTarget) -> ProcessGroup | None:
    """The background thread's gloo process group (made once, collectively), or None in one process."""
    import torch.distributed as dist

    if target.state.num_processes <= 1 or not (dist.is_available() and dist.is_initialized()):
        return None
    # torch 2.13: torch/distributed/distributed_c10d.py:1420 (private; to notice a re-created default group)
    default = dist.distributed_c10d._get_default_group()
    made = _GROUPS.get("made")
    # Compared by identity, holding the default group: a process group re-created after
    # destroy_process_group() (a new Accelerator) must get a new background group, even at the same id().
    if made is not None and made[0] is default:
        return made[1]
    group = dist.new_group(backend="gloo")
    assert isinstance(group, dist.ProcessGroup)  # every process is a member: never the non-member marker
    _GROUPS["made"] = (default, group)
    return group


def _exchange_on(group: ProcessGroup | None) -> Exchange:
    """The all-gather the background thread uses: on ``group`` (the training's own without one)."""
    if group is None:
        return sync.gather
    import torch.distributed as dist

    def exchange(obj: _T, num_processes: int) -> list[_T]:
        out = [obj] * dist.get_world_size(group)  # every entry is replaced by that rank's object
        dist.all_gather_object(out, obj, group=group)
        return out

    return exchange


def _lower_priority() -> None:
    """Give this (background) thread the nice value ``BACKGROUND_NICE`` (Linux; best effort)."""
    if BACKGROUND_NICE <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        thread = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, thread)
        if current < BACKGROUND_NICE:
            os.setpriority(os.PRIO_PROCESS, thread, BACKGROUND_NICE)
    except OSError:  # a sandbox may refuse it: the write just keeps the training's priority
        logger.debug("could not lower the background save's priority", exc_info=True)


def _background_writer(
    snapshot: _Snapshot | None,
    failure: BaseException | None,
    group: ProcessGroup | None,
    exchange: Exchange,
    num_processes: int,
) -> Callable[[Callable[[str], None]], None]:
    """The background's ``write(on_written)``: finish the copy, agree that every process can write, write.

    The agreement comes before DCP's collectives, so a process whose snapshot failed does not leave
    the others waiting inside ``dcp.save``.
    """

    def write(on_written: Callable[[str], None]) -> None:
        error = failure
        if snapshot is not None:
            try:
                snapshot.finish()
            except Exception as err:  # noqa: BLE001 - told to every process just below
                error = err
        _lower_priority()
        failed = [rank for rank, bad in enumerate(exchange(error is not None, num_processes)) if bad]
        if error is not None:
            raise error
        if failed or snapshot is None:
            raise atomic.CheckpointError(
                f"Checkpoint not saved: process {failed[0]} failed to copy its state to host memory (its own "
                "error says why). Save again, or with async_save=False."
            )
        snapshot.write(on_written, group)

    return write


def save_state_async(
    target: CheckpointTarget,
    output_dir: str | os.PathLike | None,
    safe_serialization: bool,
    wait_for_lock: float,
    overlap: bool = True,
    durable: bool = True,
) -> AsyncSaveHandle:
    """Start an asynchronous ``save_state``; return once the state is copied (or being copied) to host memory.

    Every process must call it (as ``save_state``). What is saved, where and how it is committed is
    exactly what :func:`accelerando.checkpointing.save_state` does; only the writing and the
    commit happen in a background thread.

    With ``overlap`` (the default, when every prepared optimizer is an ``AcceleratedOptimizer``), the
    parameters and optimizer state are copied by the background thread while the training goes on:
    the prepared optimizers' next ``step()`` waits for that copy. Until then the parameters must only
    change through the prepared optimizers (no in-place edits, ``load_state_dict`` or a second,
    unprepared optimizer); pass ``overlap=False`` (``save_state(async_save=True,
    overlap_snapshot=False)``) to copy everything before returning.

    Args:
        target: what to save (the Accelerator's checkpoint target).
        output_dir: see ``save_state``.
        safe_serialization: weights as safetensors.
        wait_for_lock: seconds to wait for another run's lock on the folder.
        overlap: copy parameters and optimizer state in the background (see above).
        durable: flush the files and renames to disk (False: a scratch save, see ``save_state``).

    Returns:
        The handle; ``result()`` waits for the commit and returns the folder (raising the save's error).

    Raises:
        ValueError, CheckpointLockedError, OSError: as ``save_state``, for what is decided before the
            background write (the folder, the lock).
    """
    set_active_accelerator(target.owner)
    _hook_exit()
    group = _background_group(target)
    exchange = _exchange_on(group)
    stack = ExitStack()  # an explicit folder's save lock: held until the background commit is done
    try:
        plan = sync._plan_everywhere(target, stack, output_dir, wait_for_lock, durable)
    except BaseException:
        stack.close()
        raise
    snapshot: _Snapshot | None = None
    failure: BaseException | None = None
    try:
        snapshot = _Snapshot(target, plan, safe_serialization, overlap and can_overlap(target))
    except Exception as err:  # noqa: BLE001 - every process learns of it in the background's gather
        failure = err
    write = _background_writer(snapshot, failure, group, exchange, int(target.state.num_processes))

    frozen = frozen_target(target, int(target.step))
    number = sync._number(plan.final_dir)
    if plan.checkpoints_dir is not None and number is not None:
        target.memory.last_saved = number  # the next save takes the next number, as after a sync one
        target.project_configuration.iteration = number + 1

    sizes: list[int] = []

    def work() -> None:
        with stack:
            results = sync._write_everywhere(frozen, plan, safe_serialization, write, exchange)
            sizes.append(sync._commit_everywhere(frozen, plan, results, exchange))

    handle = AsyncSaveHandle(
        plan.final_dir, lambda: sync._report_to_trackers(frozen, plan.final_dir, sizes[0] if sizes else 0)
    )
    target.memory.pending = handle
    handle._memory = weakref.ref(target.memory)
    handle._start(work)
    return handle
