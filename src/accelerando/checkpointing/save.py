"""``Accelerator.save_state``: the multi-process commit protocol.

Every process runs this, in this order:
1. the committing process (main, or each node's local main with ``save_on_each_node``) takes the
   folder's lock (:mod:`~accelerando.checkpointing.lock`: the project lock, held until the process
   ends, for automatically named checkpoints; a lock for the length of the save for an explicit
   folder), clears leftovers of interrupted saves, picks the checkpoint's number (one no existing
   ``checkpoint_<n>`` has, damaged ones included) and creates this run's hidden staging folder; every
   process learns the outcome (a refusal raises the same error everywhere) and the staging folder;
2. every process writes its files into the staging folder, flushes them to disk and computes their
   size and checksum; the results (or a failure) are gathered on every process, which is the barrier
   that guarantees every rank's files are in place;
3. the committing process writes the manifest and renames the folder into place, then rotates old
   checkpoints (only now, so a crash never costs a complete checkpoint); every process learns whether
   the commit succeeded.

A full disk is reported as ``OSError(ENOSPC)`` with the bytes needed and free; nothing is committed and
the staging folder is removed.
"""

from __future__ import annotations

import errno
import logging
import os
import time
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

import torch

import accelerando.checkpointing.atomic as atomic
import accelerando.checkpointing.lock as lock
import accelerando.checkpointing.page_cache as page_cache
import accelerando.checkpointing.removal as removal
from accelerando.checkpointing.collective import gather, is_committer, save_on_each_node
from accelerando.checkpointing.elastic import manifest_facts
from accelerando.checkpointing.project import (
    NUMBERED,
    RESUME_POINT,
    checkpoint_numbers,
    checkpoints_dir,
    owns_loading,
)
from accelerando.checkpointing.public import save_custom_state
from accelerando.checkpointing.ray_report import report_to_ray
from accelerando.checkpointing.state_io import (
    capture_gradients,
    write_state_files,
)
from accelerando.checkpointing.target import CheckpointMemory, CheckpointTarget
from accelerando.core.runtime import set_active_accelerator
from accelerando.core.version import __version__
from accelerando.scheduler import AcceleratedScheduler

if TYPE_CHECKING:
    from accelerando.checkpointing.collective import Exchange

    # Each process's (rank, node, committer, (final_dir, staging) or None, failure report, retry).
    _ClaimEntry = tuple[int, int, bool, tuple[str, str] | None, tuple[str, str] | None, bool]
    # Each process's (rank, failure report, its files' entries).
    _WriteResult = tuple[int, tuple[str, str] | None, dict[str, atomic.FileEntry]]

__all__ = ["save_state_sync"]

logger = logging.getLogger(__name__)


@dataclass
class _Plan:
    """Where this save goes, as every process learns it after step 1."""

    final_dir: str
    staging: str
    checkpoints_dir: str | None  # with automatic naming
    committer: bool
    each_node: bool
    durable: bool = True  # False: a scratch save, without fsync (the checkpoint_durable setting)
    # Files the committing process wrote and has not flushed yet: flushed with the manifest (durable).
    unflushed: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------ errors, everywhere
def _report(error: BaseException | None) -> tuple[str, str] | None:
    """How a local failure is told to the other processes: ``(kind, message)``."""
    if error is None:
        return None
    if isinstance(error, lock.CheckpointLockedError):
        return "locked", str(error)
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return "nospace", str(error.strerror or error)
    if isinstance(error, ValueError):
        return "value", str(error)
    return "error", f"{type(error).__name__}: {error}"


def _raise_reported(
    own: BaseException | None, failed: list[tuple[int, tuple[str, str]]], doing: str
) -> NoReturn:
    """Raise the local error, or the same kind of error as the first failed process (every rank raises)."""
    if own is not None:
        raise own
    rank, (kind, message) = failed[0]
    if kind == "locked":
        raise lock.CheckpointLockedError(message)
    if kind == "nospace":
        raise OSError(errno.ENOSPC, f"process {rank}: {message}")
    if kind == "value":
        raise ValueError(message)
    raise atomic.CheckpointError(f"Checkpoint not saved: process {rank} failed to {doing}: {message}")


def _state_bytes(target: CheckpointTarget) -> int:
    """About how many bytes this process's part of a checkpoint takes: its weights and optimizer state."""
    seen: set[int] = set()
    total = 0

    def add(value: object) -> None:
        nonlocal total
        if isinstance(value, torch.Tensor):
            key = value.untyped_storage().data_ptr() + int(value.storage_offset()) * value.element_size()
            if key not in seen or key == 0:
                seen.add(key)
                total += int(value.nbytes)

    try:
        for model in target.models:
            for tensor in (*model.parameters(), *model.buffers()):
                add(tensor)
        for optimizer in target.optimizers:
            for values in getattr(optimizer, "state", {}).values():
                for value in values.values() if isinstance(values, dict) else ():
                    add(value)
    except Exception:  # noqa: BLE001 - an estimate for a message; engines may hide their state
        logger.debug("could not estimate the checkpoint's size", exc_info=True)
    return total


# What writing into a folder the user cannot write to raises: permission denied, a read-only file system.
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def _translated(
    error: BaseException, target: CheckpointTarget, final_dir: str, staging: str
) -> BaseException:
    """``error``, or the same kind of ``OSError`` leading with what the user must do about it.

    A folder that is not writable (permission denied, read-only file system) is named with the fix;
    a full disk says how much space is needed (``ENOSPC``).
    """
    if isinstance(error, OSError) and error.errno in _NOT_WRITABLE:
        folder = os.path.dirname(os.fspath(error.filename)) if error.filename else os.path.dirname(final_dir)
        translated = OSError(
            error.errno,
            f"Cannot save the checkpoint {final_dir!r}: the folder {folder!r} is not writable "
            f"({error.strerror or error}): save elsewhere (another project_dir or output_dir) or fix its "
            "permissions.",
        )
        translated.__cause__ = error
        return translated
    needed = _state_bytes(target)
    if not atomic.is_out_of_space(error, staging, needed):
        return error
    translated = atomic.no_space_error(error, final_dir, staging, needed)
    translated.__cause__ = error
    return translated


# ------------------------------------------------------------------------- step 1: where it goes
def _wait_for_lock(target: CheckpointTarget, kwargs: dict[str, object]) -> float:
    """Seconds to wait for another process's lock: the keyword, else the setting, else the module's default."""
    value = kwargs.pop("wait_for_lock", None)
    if value is None:
        value = target.settings.checkpoint_lock_wait
    return lock.check_wait(lock.WAIT_FOR_LOCK_S if value is None else value)


def _resumed_number(target: CheckpointTarget, root: str, run: CheckpointMemory) -> int | None:
    """Number of the checkpoint of ``root`` the last ``load_state`` restored, or None.

    The first time a resume point is seen, the newer checkpoints it passed over (damaged ones it fell
    back from) are remembered: rotation does not count them against ``total_limit``.
    """
    point = target.memory.peek(RESUME_POINT)
    if point is None:
        return None
    folder = os.path.abspath(point.checkpoint)
    match = NUMBERED.match(os.path.basename(folder))
    if match is None or os.path.dirname(folder) != os.path.abspath(root):
        return None
    number = int(match.group(1))
    if point is not run.resumed:
        run.resumed = point
        run.skipped = {os.path.join(root, f"checkpoint_{n}") for n in checkpoint_numbers(root) if n > number}
    return number


def _next_number(target: CheckpointTarget, root: str, run: CheckpointMemory) -> int:
    """The number of the next automatically named checkpoint (committing process, holding the lock).

    ``project_configuration.iteration`` unless a ``checkpoint_<n>`` at or above it exists (a damaged
    checkpoint a resume fell back from, or an earlier run's): then the number after the newest.

    Raises:
        ValueError: If the user set ``iteration`` to the number of an existing checkpoint.
    """
    requested = int(target.project_configuration.iteration)
    numbers = checkpoint_numbers(root)
    resumed = _resumed_number(target, root, run)
    ours = {n + 1 for n in (run.last_saved, resumed) if n is not None}  # what save/load set it to
    if requested in numbers and requested not in ours:
        raise ValueError(
            f"Checkpoint folder {os.path.join(root, f'checkpoint_{requested}')!r} already exists (iteration "
            f"{requested}). Call accelerator.load_state() first to resume (numbering then continues), or set "
            f"accelerator.project_configuration.iteration to the next free number ({numbers[-1] + 1})."
        )
    number = max([requested, *(n + 1 for n in numbers)])
    if number != requested:
        logger.info("%s holds checkpoint_%d: saving checkpoint_%d", root, numbers[-1], number)
    return number


def _claim(
    target: CheckpointTarget, stack: ExitStack, root: str | None, final_dir: str, wait: float
) -> tuple[str, str]:
    """Committing process: lock, clean leftovers, pick the folder, create the staging folder."""
    run = target.memory
    removal.wait_for_removals()  # the previous save's replaced folders are gone before this one writes
    if root is not None:
        lock.hold(
            target.owner, run.locks, root, wait, root, run.token
        )  # root: the project's checkpoints folder
        atomic.remove_stale(root, "checkpoint_")  # ours alone to clean: we hold the lock
        final_dir = os.path.join(root, f"checkpoint_{_next_number(target, root, run)}")
    else:
        stack.enter_context(lock.save_lock(final_dir, wait, run.token))
        atomic.remove_stale_of(final_dir)
    staging = atomic.prepare_staging(final_dir, run.token)
    _release_replaced(target, root, final_dir)
    return final_dir, staging


def _release_replaced(target: CheckpointTarget, root: str | None, final_dir: str) -> None:
    """Drop the clean cached pages of the checkpoints this save replaces or rotates out (see
    :mod:`accelerando.checkpointing.page_cache`): the new files are written into the memory they held.
    """
    leaving = [final_dir] if os.path.isdir(final_dir) and not os.path.islink(final_dir) else []
    if root is not None:
        number = _number(final_dir)
        limit = target.project_configuration.total_limit
        leaving += atomic.rotated_out(root, limit, target.memory.skipped, number)
    for folder in leaving:
        size, durable = _committed_facts(target.memory, folder)
        if size >= removal.BACKGROUND_MIN_BYTES:
            page_cache.release_cached(folder, known_clean=durable)


def _committed_facts(run: CheckpointMemory, folder: str) -> tuple[int, bool]:
    """``(bytes, saved durably)`` of the checkpoint ``folder``: remembered if this Accelerator saved it,
    else from its manifest (``(0, False)`` when that cannot be read).
    """
    known = run.committed.get(folder)
    if known is not None:
        return known
    try:
        manifest = atomic.read_manifest(folder)
    except atomic.CheckpointError:
        return 0, False
    return sum(entry.size for entry in manifest.files.values()), manifest.extra.get("durable") is True


# While waiting for another run's lock, the processes meet this often, so that none of them sits in one
# collective for the whole wait (which the process group's timeout would end with an obscure error).
_WAIT_SLICE_S = 2.0


def _claim_in_slices(
    target: CheckpointTarget, stack: ExitStack, plan: tuple[str | None, str, bool, int], wait: float
) -> tuple[list[_ClaimEntry], BaseException | None, tuple[str, str] | None]:
    """The committers claim the folder, retrying in slices of the wait; every process learns the outcome.

    Returns:
        Every process's ``(rank, node, committer, (final_dir, staging) or None, failure report, retry)``, this
        process's error, and its claim. Every process loops while some committer reports ``retry``
        (and none failed), so all agree on when to stop.
    """
    root, final_dir, committer, node = plan
    state = target.state
    deadline = time.monotonic() + wait
    claimed: tuple[str, str] | None = None
    error: BaseException | None = None
    while True:
        retry = False
        if committer and claimed is None and error is None:
            left = max(0.0, deadline - time.monotonic())
            try:
                claimed = _claim(target, stack, root, final_dir, min(left, _WAIT_SLICE_S))
            except lock.CheckpointLockedError as err:
                retry = left > _WAIT_SLICE_S
                error = None if retry else lock.refusal(err.lock_file, wait, err.folder)
            except Exception as err:  # noqa: BLE001 - every process must learn of it before anyone raises
                error = _translated(
                    err, target, final_dir, atomic.staging_path(final_dir, target.memory.token)
                )
        report = _report(error)
        entry: _ClaimEntry = (state.process_index, node, committer, claimed, report, retry)
        entries = gather(entry, state.num_processes)
        if not any(entry[5] for entry in entries) or any(entry[4] is not None for entry in entries):
            return entries, error, claimed


def _plan_everywhere(
    target: CheckpointTarget,
    stack: ExitStack,
    output_dir: str | os.PathLike | None,
    wait: float,
    durable: bool = True,
) -> _Plan:
    """Step 1 on every process: the committers claim the folder; everyone learns the outcome.

    ``durable``: whether the save flushes its files and renames to disk (see :class:`_Plan`).
    """
    state = target.state
    root, final_dir = _requested_dir(target, output_dir)
    each_node = save_on_each_node(target, final_dir)
    committer = is_committer(state, each_node)
    # Each process writes into its node's committer's staging folder (the main process's, unless
    # save_on_each_node is in effect).
    node = int(state.cluster.node_rank) if each_node else 0
    entries, error, claimed = _claim_in_slices(target, stack, (root, final_dir, committer, node), wait)
    failed = [(rank, report) for rank, _, _, _, report, _ in entries if report is not None]
    if failed:
        if claimed is not None:
            atomic.discard(claimed[1])
        _raise_reported(error, failed, f"prepare {final_dir!r}")
    # No process failed: every committer has claimed its folder.
    claims = {n: c for _, n, is_committing, c, _, _ in entries if is_committing and c is not None}
    final_dir, staging = claims[node]
    if root is not None and len({f for f, _ in claims.values()}) > 1:
        # Nodes with their own disks proposed different numbers: all take the highest (free on each).
        final_dir = max((f for f, _ in claims.values()), key=lambda f: int(f.rsplit("_", 1)[1]))
        renamed = atomic.staging_path(final_dir, os.path.basename(staging).split(".")[-2])
        if committer:
            os.rename(staging, renamed)
        staging = renamed
        state.wait_for_everyone()
    if output_dir is not None and root is not None and os.path.abspath(output_dir) != final_dir:
        logger.warning("automatic_checkpoint_naming is on: saving to %s instead of %s", final_dir, output_dir)
    return _Plan(final_dir, staging, root, committer, each_node, durable)


def _requested_dir(target: CheckpointTarget, output_dir: str | os.PathLike | None) -> tuple[str | None, str]:
    """``(checkpoints folder or None, the folder asked for)``; the number may still change."""
    config = target.project_configuration
    if config.automatic_checkpoint_naming:
        root = os.path.abspath(checkpoints_dir(target))
        return root, os.path.join(root, f"checkpoint_{config.iteration}")
    if output_dir is None:
        raise ValueError(
            "save_state() needs output_dir= unless automatic checkpoint naming is on; pass a folder, or "
            "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)."
        )
    return None, os.path.abspath(os.fspath(output_dir))


# ------------------------------------------------------------------------------ step 2: the files
def _mid_accumulation(target: CheckpointTarget) -> bool:
    """Whether gradients of an unfinished accumulation cycle are pending."""
    return not bool(target.sync_gradients)


def _write_process_files(
    target: CheckpointTarget,
    staging: str,
    safe_serialization: bool,
    each_node: bool,
    on_written: Callable[[str], None],
) -> None:
    """Write this process's files into the staging folder, handing each name to ``on_written``."""
    models = list(target.models)
    # None marks an optimizer the strategy wrote itself (left out of the files written below).
    optimizers: list[torch.optim.Optimizer | None] = list(target.optimizers)
    strategy = target.strategy
    # Sharded strategies (FSDP, DeepSpeed) write their own per-process files on every process;
    # whatever they handle is left out of the files written below (None entries are skipped).
    weights: list[dict[str, torch.Tensor] | None] = []
    for i, model in enumerate(models):
        own = strategy is not None and strategy.save_model_checkpoint(model, staging, i, safe_serialization)
        weights.append(None if own else target.get_state_dict(model))
    for i, optimizer in enumerate(target.optimizers):
        owner = models[i] if i < len(models) else None
        if strategy is not None and strategy.save_optimizer_checkpoint(optimizer, owner, staging, i):
            optimizers[i] = None
    for hook in target.save_hooks:
        hook(models, weights, staging)
    grads = None
    if _mid_accumulation(target):
        if not owns_loading(target):
            grads = capture_gradients(models)
        elif target.state.is_main_process:
            warnings.warn(
                f"save_state() ran in the middle of a gradient accumulation cycle under {strategy.name}: the "
                "gradients accumulated so far are held by the strategy and are not in the checkpoint, so a "
                "run resumed from it will not continue bit-exactly. Save when accelerator.sync_gradients is "
                "True (right after the optimizer step of a full cycle).",
                stacklevel=4,
            )
    write_state_files(
        staging,
        weights,
        optimizers,
        list(target.schedulers),
        list(target.dataloaders),
        target.state.process_index,
        int(target.step),
        scaler=target.scaler,
        save_on_each_node=each_node,
        safe_serialization=safe_serialization,
        gradients=grads,
        on_written=on_written,
    )
    for i, obj in enumerate(target.custom_objects):
        written = save_custom_state(obj, staging, i, each_node)
        if written is not None:
            on_written(os.path.basename(written))


def _commit_staged(target: CheckpointTarget, plan: _Plan, results: list[_WriteResult]) -> int:
    """Committing process: manifest + atomic rename. Returns the checkpoint's size in bytes."""
    staging, final_dir = plan.staging, plan.final_dir
    number = _number(final_dir) if plan.checkpoints_dir is not None else None
    iteration = int(target.project_configuration.iteration) if number is None else number
    entries: dict[str, atomic.FileEntry] = {}
    for _, _, described in results:
        entries.update(described)
    # With save_on_each_node (no shared file system) only this node's files are here to commit.
    entries = {name: entry for name, entry in entries.items() if os.path.exists(os.path.join(staging, name))}
    extra, folders = _unlisted(staging, entries)
    unflushed = plan.unflushed
    if extra:
        described, flush = _describe(staging, extra, plan.durable)
        entries.update(described)
        unflushed = [*unflushed, *flush]

    manifest = atomic.Manifest(
        files=entries,
        world_size=int(target.state.num_processes),
        library_version=__version__,
        extra={
            "step": int(target.step),
            "iteration": iteration,
            "durable": plan.durable,
            **_pace(target),
            "layout": _layout(target),
        },
    )
    atomic.commit(staging, final_dir, manifest, plan.durable, flush=unflushed, flush_folders=folders)
    return sum(entry.size for entry in entries.values())


def _pace(target: CheckpointTarget) -> dict[str, object]:
    """How the run steps (accumulation, each scheduler's advances per optimizer step), for a resize."""
    repeats = [
        scheduler.steps_per_optimizer_step if isinstance(scheduler, AcceleratedScheduler) else 1
        for scheduler in target.schedulers
    ]
    return manifest_facts(target.gradient_accumulation_steps, repeats)


def _layout(target: CheckpointTarget) -> dict[str, object]:
    """How models and optimizers were written (format, strategy, ZeRO stage...): a load under another
    strategy decides from it, before reading anything, whether and how to convert.
    """
    return target.strategy.checkpoint_layout(list(target.models), list(target.optimizers))


def _unlisted(staging: str, entries: dict[str, atomic.FileEntry]) -> tuple[list[str], list[str]]:
    """The files of the staging folder that ``entries`` lacks (written by save hooks, or by the strategy
    on other processes), and its sub-folders (whose entries a durable save flushes too).
    """
    extra: list[str] = []
    folders: list[str] = []
    for root, _, filenames in os.walk(staging):
        if root != staging:
            folders.append(root)
        for filename in filenames:
            rel = os.path.relpath(os.path.join(root, filename), staging)
            if rel not in entries and rel != atomic.MANIFEST_NAME:
                extra.append(rel)
    return extra, folders


def _describe(staging: str, names: list[str], durable: bool) -> tuple[dict[str, atomic.FileEntry], list[str]]:
    """The manifest entries of ``names`` (files of the staging folder), and the paths still to flush."""
    describer = atomic.FileDescriber(staging, durable)
    try:
        for name in names:
            describer.add(name)
        return describer.finish(flush=False), describer.unflushed()
    finally:
        describer.close()


def _number(final_dir: str) -> int | None:
    match = NUMBERED.match(os.path.basename(final_dir))
    return int(match.group(1)) if match else None


def _write_everywhere(
    target: CheckpointTarget,
    plan: _Plan,
    safe_serialization: bool,
    write: Callable[[Callable[[str], None]], None] | None = None,
    exchange: Exchange = gather,
) -> list[_WriteResult]:
    """Every process writes and describes its files; all learn whether every process succeeded.

    ``write(on_written)`` writes this process's files (default: from the live objects); ``exchange`` is
    the all-gather (an asynchronous save's background thread passes one on a process group of its own).

    Returns:
        ``[(rank, None, entries), ...]`` for every process.

    Raises:
        The local error (``OSError(ENOSPC)`` for a full disk), or the same kind of error naming the
        failed process (the staging is discarded).
    """
    state = target.state
    staging = plan.staging
    error: BaseException | None = None
    described: dict[str, atomic.FileEntry] = {}
    describer = atomic.FileDescriber(staging, plan.durable)
    try:
        if write is None:
            _write_process_files(target, staging, safe_serialization, plan.each_node, describer.add)
        else:
            write(describer.add)
        # The committing process flushes its files with the manifest (one wait on the disk for all);
        # the others flush theirs now, before the gather tells the committer they are in place.
        described = describer.finish(flush=not plan.committer)
        plan.unflushed = describer.unflushed()
    except Exception as err:  # noqa: BLE001 - reported to every process below
        error = _translated(err, target, plan.final_dir, staging)
    finally:
        describer.close()
    result: _WriteResult = (state.process_index, _report(error), described)
    results = exchange(result, state.num_processes)
    failed = [(rank, report) for rank, report, _ in results if report is not None]
    if failed:
        if plan.committer:
            atomic.discard(staging)
        _raise_reported(error, failed, f"write {plan.final_dir!r}")
    return results


def _commit_everywhere(
    target: CheckpointTarget,
    plan: _Plan,
    results: list[_WriteResult],
    exchange: Exchange = gather,
) -> int:
    """Step 3: the committing process commits and rotates; every process learns the outcome.

    Returns:
        The checkpoint's size in bytes (on the committing process; 0 elsewhere).
    """
    state = target.state
    size = 0
    error: BaseException | None = None
    if plan.committer:
        try:
            size = _commit_staged(target, plan, results)
            target.memory.remember_commit(plan.final_dir, size, plan.durable)
        except Exception as err:  # noqa: BLE001 - every process must learn of it before anyone raises
            error = _translated(err, target, plan.final_dir, plan.staging)
            atomic.discard(plan.staging)
        if error is None and plan.checkpoints_dir is not None:
            _rotate(target, plan.checkpoints_dir, plan.durable)
    verdicts = exchange((state.process_index, _report(error)), state.num_processes)
    failed = [(rank, report) for rank, report in verdicts if report is not None]
    if failed:
        _raise_reported(error, failed, f"commit {plan.final_dir!r}")
    return size


def _rotate(target: CheckpointTarget, root: str, durable: bool = True) -> None:
    """Delete checkpoints beyond ``total_limit``; a failure leaves extra ones behind, with a warning."""
    try:
        atomic.rotate(root, target.project_configuration.total_limit, target.memory.skipped, durable)
    except OSError as err:
        warnings.warn(
            f"Could not delete old checkpoints in {root!r} ({err}); delete them by hand.", stacklevel=4
        )


def save_state_sync(
    target: CheckpointTarget,
    output_dir: str | os.PathLike | None,
    safe_serialization: bool,
    wait: float,
    durable: bool = True,
) -> str:
    """Write and commit one checkpoint in the calling thread (see :func:`accelerando.checkpointing.save_state`).

    ``durable=False``: a scratch save, every step but the ``fsync`` calls (the ``checkpoint_durable`` setting).

    Returns:
        The committed checkpoint folder.
    """
    set_active_accelerator(target.owner)
    with ExitStack() as stack:  # an explicit folder's save lock, until the commit is done
        plan = _plan_everywhere(target, stack, output_dir, wait, durable)
        results = _write_everywhere(target, plan, safe_serialization)
        size = _commit_everywhere(target, plan, results)
    number = _number(plan.final_dir)
    if plan.checkpoints_dir is not None and number is not None:
        target.memory.last_saved = number
        target.project_configuration.iteration = number + 1
    _report_to_trackers(target, plan.final_dir, size)
    report_to_ray(target, plan.final_dir)  # every process: Ray Train's report is a barrier
    return plan.final_dir


def _report_to_trackers(target: CheckpointTarget, path: str, size: int) -> None:
    """Report a committed checkpoint (path, size) to the active trackers, on the main process.

    The target logs only when the ``log_checkpoint_metrics`` setting asks for it, at the script's step.
    """
    if not target.state.is_main_process:
        return
    target.log_checkpoint(path, size)
