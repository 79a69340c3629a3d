"""The public checkpoint helpers, in their folder-only form and in the explicit form.

- ``save_accelerator_state(output_dir)`` / ``load_accelerator_state(input_dir)`` with only a folder
  act on the active ``Accelerator`` (crash-safe, through ``Accelerator.save_state``).
- The explicit forms take the objects themselves and write or read the files of one folder.
- ``save_custom_state`` / ``load_custom_state`` accept a folder (``custom_checkpoint_<i>.pkl``
  inside it) or a file path, and objects with ``state_dict`` or plain picklable values.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

import accelerando.checkpointing.atomic as atomic
import accelerando.checkpointing.files as F
import accelerando.core.runtime as runtime
from accelerando.checkpointing.manifest import (
    MANIFEST_NAME,
    CheckpointError,
    inspect_checkpoint,
    read_manifest,
    require_listed,
    scan_folder,
    verify_checkpoint,
)
from accelerando.checkpointing.sources import read_once
from accelerando.checkpointing.state_io import (
    apply_state,
    check_load_kwargs,
    needed_files,
    read_state_files,
    torch_load_options,
    write_state_files,
)
from accelerando.common.serialization import _should_write
from accelerando.state import PartialState

if TYPE_CHECKING:
    from torch.serialization import MAP_LOCATION

    from accelerando.checkpointing.state_io import StateSource
    from accelerando.checkpointing.target import Stateful

__all__ = [
    "active_accelerator",
    "load_accelerator_state",
    "load_custom_state",
    "save_accelerator_state",
    "save_custom_state",
]

logger = logging.getLogger(__name__)


class _SavesAndLoads(Protocol):
    """What the folder-only forms use of the active ``Accelerator``."""

    def save_state(self, output_dir: str, *, safe_serialization: bool = True) -> str:
        """Save everything crash-safely into ``output_dir``; return the folder."""
        ...

    def load_state(
        self,
        input_dir: str,
        *,
        map_location: MAP_LOCATION = None,
        load_kwargs: dict[str, object] | None = None,
        verify_checksums: bool = True,
        **load_model_func_kwargs: bool,
    ) -> None:
        """Restore everything from ``input_dir``."""
        ...


def active_accelerator() -> _SavesAndLoads:
    """Return the active ``Accelerator`` (the newest one created in this process).

    Raises:
        ValueError: If no Accelerator exists in this process.
    """
    found = runtime.active_accelerator()
    if found is None:
        raise ValueError(
            "save_accelerator_state/load_accelerator_state with only a folder act on the active Accelerator, "
            "but none exists; create one with Accelerator() first, or pass the objects explicitly."
        )
    return found


def save_accelerator_state(
    output_dir: str | os.PathLike,
    model_states: Sequence[dict[str, torch.Tensor]] | None = None,
    optimizers: Sequence[StateSource] | None = None,
    schedulers: Sequence[StateSource] | None = None,
    dataloaders: Sequence[object] | None = None,
    process_index: int | None = None,
    step: int | None = None,
    scaler: StateSource | None = None,
    save_on_each_node: bool = False,
    safe_serialization: bool = True,
) -> str:
    """Save training state into ``output_dir``.

    With only ``output_dir`` (and ``safe_serialization``), saves everything the active Accelerator
    prepared, crash-safely (see ``Accelerator.save_state``). With the objects given (the reference's
    form), writes this process's files directly into ``output_dir``: model weights (from
    ``model_states``), optimizer, scheduler, dataloader and scaler states, and the random states of
    process ``process_index`` together with ``step``.

    Args:
        output_dir: Destination folder.
        model_states: State dicts of the models, in order.
        optimizers: Optimizers whose ``state_dict()`` is saved.
        schedulers: Learning-rate schedulers.
        dataloaders: Dataloaders (their ``state_dict()``, or their sampler's).
        process_index: Index of this process (names its random-state file).
        step: Training step counter stored beside the random states.
        scaler: A ``torch.amp.GradScaler`` or None.
        save_on_each_node: Write the shared files on every node's local main process.
        safe_serialization: Weights as safetensors (else ``torch.save``).

    Returns:
        The folder written.

    Example:
        >>> from accelerando import Accelerator
        >>> from accelerando.utils import save_accelerator_state
        >>> accelerator = Accelerator(cpu=True)
        >>> path = save_accelerator_state("checkpoint/step_1000")  # the active Accelerator's state
    """
    explicit = (model_states, optimizers, schedulers, dataloaders, process_index, step, scaler)
    if all(value is None for value in explicit):
        return active_accelerator().save_state(os.fspath(output_dir), safe_serialization=safe_serialization)
    output_dir = os.fspath(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    try:
        write_state_files(
            output_dir,
            list(model_states or []),
            list(optimizers or []),
            list(schedulers or []),
            list(dataloaders or []),
            _process_index(process_index),
            int(step or 0),
            scaler,
            save_on_each_node,
            safe_serialization,
        )
    except Exception as error:
        needed = _tensor_bytes([*(model_states or []), *(opt.state_dict() for opt in optimizers or [])])
        if not atomic.is_out_of_space(error, output_dir, needed):
            raise
        raise _no_space_in_folder(error, output_dir, needed) from error
    return output_dir


def _tensor_bytes(values: object) -> int:
    """Bytes of every tensor inside nested dicts / lists (an estimate for a message)."""
    if isinstance(values, torch.Tensor):
        return int(values.nbytes)
    if isinstance(values, dict):
        return sum(_tensor_bytes(v) for v in values.values())
    if isinstance(values, (list, tuple)):
        return sum(_tensor_bytes(v) for v in values)
    return 0


def _no_space_in_folder(error: BaseException, folder: str, needed: int) -> OSError:
    """The explicit form writes in place: say so, with the bytes needed and free."""
    try:
        free = f"{atomic.free_bytes(folder):,} bytes are free"
    except OSError:
        free = "the free space is unknown"
    cause = " ".join(str(error).split())[:80]
    return OSError(
        errno.ENOSPC,
        f"Saving into {folder!r} failed: no space left on device. It needs about {needed:,} bytes and {free} "
        "there. The files written into that folder so far are incomplete: delete them, free some space or "
        "save to another disk; Accelerator.save_state() writes crash-safe checkpoints that are never left "
        f"half-written (the write failed with: {cause}).",
    )


def _process_index(process_index: int | None) -> int:
    if process_index is not None:
        return int(process_index)

    return PartialState().process_index


def load_accelerator_state(
    input_dir: str | os.PathLike,
    models: Sequence[torch.nn.Module] | None = None,
    optimizers: Sequence[torch.optim.Optimizer] | None = None,
    schedulers: Sequence[Stateful] | None = None,
    dataloaders: Sequence[object] | None = None,
    process_index: int | None = None,
    scaler: Stateful | None = None,
    map_location: MAP_LOCATION = None,
    load_kwargs: dict[str, object] | None = None,
    verify_checksums: bool = True,
    **load_model_func_kwargs: bool,
) -> dict[str, int] | None:
    """Load training state from ``input_dir``.

    With only ``input_dir``, restores the active Accelerator (see ``Accelerator.load_state``). With
    the objects given (the reference's form), reads the folder's files, verifies them against the
    manifest when there is one, and only then loads them into the objects.

    Args:
        input_dir: Folder written by :func:`save_accelerator_state` or ``save_state``.
        models: Models to load weights into (wrappers such as DDP are looked through).
        optimizers: Optimizers to restore.
        schedulers: Schedulers to restore.
        dataloaders: Dataloaders to restore (their ``load_state_dict``, or their sampler's).
        process_index: Index of this process (selects its random-state file).
        scaler: GradScaler to restore, or None.
        map_location: Device for loaded weights (default CPU; ``load_state_dict`` copies them).
        load_kwargs: The reference's ``torch.load`` options. Files are read with ``weights_only=True``;
            ``{"weights_only": False}`` is the explicit opt-in to fully unpickle files that need it (runs
            any code they hold: only for checkpoints you trust). Other keys (``mmap``, ``encoding``...) go to
            every ``torch.load``; ``map_location`` there is used when ``map_location`` is not given.
        verify_checksums: Compare every file's checksum with the manifest (sizes are always checked).
        **load_model_func_kwargs: Passed to each model's ``load_state_dict`` (e.g. ``strict=False``).

    Returns:
        ``{"step": <saved step>}`` in the explicit form; None in the folder-only form.

    Raises:
        CheckpointError: If a file is missing, truncated, corrupted, not listed in the manifest or a
            symbolic link, or the manifest is invalid (the message names it).
        UnsafeCheckpointError: If a file needs full unpickling and ``load_kwargs`` does not opt in.

    Example:
        >>> from accelerando import Accelerator
        >>> from accelerando.utils import load_accelerator_state, save_accelerator_state
        >>> accelerator = Accelerator(cpu=True)
        >>> path = save_accelerator_state("checkpoint")  # the active Accelerator's state
        >>> load_accelerator_state("checkpoint")  # restores it
    """
    explicit = (models, optimizers, schedulers, dataloaders, process_index, scaler)
    if all(value is None for value in explicit):
        active_accelerator().load_state(
            os.fspath(input_dir),
            map_location=map_location,
            load_kwargs=load_kwargs,
            verify_checksums=verify_checksums,
            **load_model_func_kwargs,
        )
        return None
    weights_only = check_load_kwargs(load_kwargs)
    map_location, load_options = torch_load_options(load_kwargs, map_location)
    folder = os.fspath(input_dir)
    models, optimizers = list(models or []), list(optimizers or [])
    schedulers, dataloaders = list(schedulers or []), list(dataloaders or [])
    rank = _process_index(process_index)
    counts = (len(models), len(optimizers), len(schedulers), len(dataloaders), rank, scaler is not None)
    sources: dict[str, memoryview] = {}
    guard = None
    if os.path.lexists(os.path.join(folder, MANIFEST_NAME)):
        manifest, _ = inspect_checkpoint(folder)  # parse, scan (links refused), sizes of every file
        # Each file read once and checked; the same bytes are deserialized below.
        sources, guard = read_once(folder, manifest, needed_files(folder, *counts), verify_checksums)
    else:
        scan_folder(folder, recursive=False)  # links refused before any name is looked up
        logger.warning("%s has no %s: loading it without verification", folder, MANIFEST_NAME)
    try:
        with F.unpickling(weights_only, load_options):
            loaded = read_state_files(folder, *counts, map_location=map_location, sources=sources)
    except BaseException:
        if guard is not None:
            guard.close()
        raise
    loaded.files = guard  # checked around the apply (a file changed on disk is refused), then closed
    apply_state(loaded, models, optimizers, schedulers, dataloaders, scaler, **load_model_func_kwargs)
    return {"step": loaded.step if loaded.step is not None else 0}


def _custom_target(path: str | os.PathLike, index: int) -> tuple[str, bool]:
    """``(file path, is_folder_form)`` for a custom-state location."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return os.path.join(path, f"{F.CUSTOM_NAME}_{index}.pkl"), True
    return path, False


def save_custom_state(
    obj: object,
    path: str | os.PathLike,
    index: int = 0,
    save_on_each_node: bool = False,
    *,
    process_index: int | None = None,
    scaler: object = None,
) -> str | None:
    """Save a custom object's state.

    ``path`` may be an existing folder (the file ``custom_checkpoint_<index>.pkl`` is written inside it, the
    folder form) or a file path (the file form; ``index``/``process_index`` then selects the
    process that writes). Objects with ``state_dict()`` are saved through it; anything else
    picklable (e.g. a dict of metadata) is saved as it is.

    Args:
        obj: The object or value to save.
        path: An existing folder, or a file path (any other path).
        index: Number of the object in the folder form; writing process in the file form.
        save_on_each_node: Folder form: write on every node's local main process.
        process_index: Keyword alias of ``index`` for the file form.
        scaler: Accepted so that calls passing it keep working; not used.

    Returns:
        The file written, or None on processes that do not write.

    Example:
        >>> from accelerando.utils import save_custom_state
        >>> path = save_custom_state({"epoch": 5}, "checkpoint/metadata.pkl")
    """
    del scaler
    index = index if process_index is None else process_index
    target, folder_form = _custom_target(path, index)
    own = getattr(obj, "state_dict", None)
    state = own() if callable(own) else obj
    if folder_form:
        writes = _should_write(save_on_each_node)
    else:
        writes = _current_index() == index
    if not writes:
        return None
    parent = os.path.dirname(target)
    if parent:
        os.makedirs(parent, exist_ok=True)
    F.torch_save(state, target)
    return target


def _current_index() -> int:
    return PartialState().process_index


def load_custom_state(
    obj: object,
    path: str | os.PathLike | None = None,
    index: int = 0,
    *,
    process_index: int | None = None,
    scaler: object = None,
    load_kwargs: dict[str, object] | None = None,
) -> Any:
    """Load a custom state saved by :func:`save_custom_state`.

    Two forms: ``load_custom_state(path)`` returns the saved value (the file form);
    ``load_custom_state(obj, folder_or_file, index)`` loads it into ``obj`` with ``load_state_dict``
    (the object form) and returns the loaded state too. The file is read with ``weights_only=True``.
    In a checkpoint folder (one with a manifest) the file must be listed and intact, and may not be a
    symbolic link.

    Args:
        obj: The object to load into, or the path in the one-argument form.
        path: Folder or file path (reference form).
        index: Number of the object in a folder.
        process_index: Keyword alias of ``index``.
        scaler: Accepted so that calls passing it keep working; not used.
        load_kwargs: ``{"weights_only": False}`` opts in to fully unpickling a state that holds
            arbitrary Python objects (runs any code the file holds: only for files you trust).

    Returns:
        The loaded state.

    Raises:
        TypeError: If ``obj`` has no ``load_state_dict`` in the reference form.
        FileNotFoundError: If the file does not exist.
        CheckpointError: If the file is a link, unlisted or damaged in a checkpoint folder.
        UnsafeCheckpointError: If the state needs full unpickling and ``load_kwargs`` does not opt in.

    Example:
        >>> from accelerando.utils import load_custom_state, save_custom_state
        >>> path = save_custom_state({"epoch": 5}, "metadata.pkl")
        >>> load_custom_state("metadata.pkl")
        {'epoch': 5}
    """
    del scaler
    weights_only = check_load_kwargs(load_kwargs)
    map_location, load_options = torch_load_options(load_kwargs)
    index = index if process_index is None else process_index
    if path is None:
        if not isinstance(obj, (str, os.PathLike)):
            raise TypeError(
                "load_custom_state(path) needs a path; to load into an object call "
                "load_custom_state(obj, path, index)."
            )
        obj, path = None, obj
    target, folder_form = _custom_target(path, index)
    _check_custom_file(target, folder_form)
    with F.unpickling(weights_only, load_options):
        state = F.torch_load(target, map_location=map_location)
    if obj is not None:
        load = getattr(obj, "load_state_dict", None)
        if not callable(load):
            raise TypeError(
                f"{type(obj).__name__} has no load_state_dict(); call load_custom_state(path) to get the "
                "saved value back instead."
            )
        load(state)
    return state


_CUSTOM_FILE = re.compile(rf"^{F.CUSTOM_NAME}_\d+\.pkl$")


def _check_custom_file(target: str, folder_form: bool) -> None:
    """Refuse a link, and in a checkpoint folder an unlisted or damaged file, before it is read.

    A file the user names directly outside a checkpoint folder is theirs: it may be a link.
    """
    folder, name = os.path.split(os.path.abspath(target))
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"No custom state at {target!r}; check the path and index used when saving."
        ) from None
    in_checkpoint = os.path.lexists(os.path.join(folder, MANIFEST_NAME))
    if stat.S_ISLNK(info.st_mode) and (in_checkpoint or folder_form):
        raise CheckpointError(
            f"{target!r} is a symbolic link: links inside a checkpoint are refused, never followed. Replace "
            "it with the file itself (e.g. cp -L), or load another checkpoint."
        )
    if not in_checkpoint:
        return
    manifest = read_manifest(folder)
    if name in manifest.files:
        verify_checkpoint(folder, checksums=True, names=[name])
    elif folder_form or _CUSTOM_FILE.match(name):
        require_listed(folder, manifest, [name])
