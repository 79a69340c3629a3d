"""State dicts of FSDP models and optimizers: full (gathered on rank 0) and sharded (DCP folders).

Everything goes through ``torch.distributed.checkpoint.state_dict`` so FSDP1 and FSDP2 models are
handled the same way and keys are the plain module names (no wrapper prefixes).
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, TypeVar, cast

import torch
import torch.distributed as dist

from accelerando.backends.strategies.conversion import (
    CheckpointConversionError,
    NamedOptimizerState,
    PortableState,
    existing_folder,
)
from accelerando.backends.strategies.ties import find_ties, share_tied_entries
from accelerando.checkpointing import files as F
from accelerando.checkpointing.async_dcp import save_or_stage
from accelerando.checkpointing.manifest import CheckpointError, check_name
from accelerando.common.constants import FSDP_MODEL_NAME, OPTIMIZER_NAME
from accelerando.common.serialization import refused_type
from accelerando.core import safe_files

if TYPE_CHECKING:
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.checkpoint.planner import ReadItem
    from torch.distributed.checkpoint.state_dict import OptimizerStateType, StateDictOptions, ValueType

_V = TypeVar("_V")

__all__ = [
    "MODEL_SHARDS_NAME",
    "OPTIMIZER_SHARDS_NAME",
    "broadcast_buffers",
    "broadcast_full_state_dict",
    "broadcast_params",
    "full_model_state_dict",
    "full_optimizer_state_dict",
    "full_shapes",
    "read_dcp_portable",
    "load_full_model_state_dict",
    "load_full_optimizer_state_dict",
    "load_sharded_model",
    "load_sharded_optimizer",
    "load_shards",
    "save_sharded_model",
    "save_sharded_optimizer",
    "safe_load_planner",
    "weights_only_dcp_reads",
]

# Folder names inside a checkpoint, as the reference names them (merge-weights takes the first).
MODEL_SHARDS_NAME = FSDP_MODEL_NAME
OPTIMIZER_SHARDS_NAME = OPTIMIZER_NAME


def _options(
    *, full_state_dict: bool = False, cpu_offload: bool = False, strict: bool = True
) -> StateDictOptions:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=full_state_dict, cpu_offload=cpu_offload, strict=strict)


def _gather_options(model: torch.nn.Module) -> StateDictOptions:
    """Full-state-dict options: gathered on rank 0 and moved to CPU.

    FSDP1 modules whose shards already live on the CPU crash (segfault, torch 2.13) when asked to
    offload to CPU; for them the gather is done without offloading and other ranks drop the copy.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    on_cpu = isinstance(model, FullyShardedDataParallel) and next(model.parameters()).device.type == "cpu"
    return _options(full_state_dict=True, cpu_offload=not on_cpu)


def broadcast_params(model: torch.nn.Module) -> None:
    """Overwrite every process's parameters and buffers with rank 0's (before sharding)."""
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor.data, src=0)


def broadcast_buffers(model: torch.nn.Module) -> None:
    """Overwrite every process's buffers with rank 0's (buffers are never sharded)."""
    with torch.no_grad():
        for buffer in model.buffers():
            dist.broadcast(buffer.data, src=0)


def broadcast_full_state_dict(
    model: torch.nn.Module, full_sd: dict[str, torch.Tensor], cpu_offload: bool = False
) -> None:
    """Load rank 0's full state dict into a sharded model; other ranks pass ``{}``.

    One tensor at a time: rank 0 broadcasts it and each process copies out only its own shard,
    so no process other than rank 0 ever holds more than its shards plus one full tensor.
    """
    from torch.distributed.tensor import DTensor

    # torch 2.13: torch/distributed/tensor/_utils.py:93 (private; where each shard lies in the full tensor)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    del cpu_offload  # shards are copied in place, wherever they live
    is_source = dist.get_rank() == 0
    with torch.no_grad():
        for name, current in model.state_dict().items():
            local = current.to_local() if isinstance(current, DTensor) else current
            if is_source:
                full = full_sd[name].to(device=local.device, dtype=local.dtype).contiguous()
            else:
                full = torch.empty(current.shape, dtype=local.dtype, device=local.device)
            dist.broadcast(full, src=0)
            if isinstance(current, DTensor):
                shape, offset = compute_local_shape_and_global_offset(
                    current.shape, current.device_mesh, current.placements
                )
                local.copy_(full[tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))])
            else:
                local.copy_(full)
            del full


def full_model_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict on rank 0 (CPU tensors); ``{}`` on the other ranks. Every rank must call it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_gather_options(model))
    if dist.get_rank() != 0:
        return {}
    # Gathered in full, a model's entries are plain tensors (torch types them with DCP's wider values).
    return cast("dict[str, torch.Tensor]", _share_tied_entries(model, state))


_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def _share_tied_entries(model: torch.nn.Module, state: dict[str, _V]) -> dict[str, _V]:
    """Names of one tied parameter share one tensor in the gathered dict, so writers store it once."""
    ties: list[list[str]] = []
    for group in find_ties(model):
        clean: list[str] = []
        for name in group:
            for prefix in _WRAPPER_PREFIXES:
                name = name.replace(prefix, "")
            clean.append(name)
        ties.append(clean)
    return share_tied_entries(state, ties)


def load_full_model_state_dict(
    model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], strict: bool = True
) -> object:
    """Load a full state dict (present on every rank) into a sharded model; torch's missing / unexpected keys."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    state: dict[str, ValueType] = dict(state_dict)
    return set_model_state_dict(model, state, options=_options(full_state_dict=True, strict=strict))


def full_shapes(model: torch.nn.Module) -> dict[str, torch.Size]:
    """The full (unsharded) shape of every entry of a sharded model's state dict, by plain name."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return {name: value.size() for name, value in get_model_state_dict(model).items()}  # type: ignore[union-attr]


def read_dcp_portable(
    folder: str, layout: Mapping[str, object], world: int, num_models: int, num_optimizers: int
) -> list[PortableState]:
    """Read DCP-sharded models and optimizers (saved by any number of processes) in full, in this process.

    Raises:
        FileNotFoundError: A model's or optimizer's shard folder is missing.
        CheckpointConversionError: A folder holds no ``model`` / ``optimizer`` entry.
        UnsafeCheckpointError: An item needs full unpickling without the caller's opt-in.
    """
    del layout, world  # DCP's metadata describes the shards, whatever wrote them
    out = []
    for index in range(max(num_models, num_optimizers)):
        parts: dict[str, object] = {}
        for stem, key in ((MODEL_SHARDS_NAME, "model"), (OPTIMIZER_SHARDS_NAME, "optimizer")):
            if key == "optimizer" and index >= num_optimizers:
                continue
            loaded: dict[str, object] = {}
            load_shards(loaded, existing_folder(folder, f"{stem}_{index}"), everything=True)
            if not isinstance(loaded.get(key), dict):
                raise CheckpointConversionError(f"{folder!r}: {stem}_{index} holds no {key!r} entry")
            parts[key] = loaded[key]
        weights = cast("dict[str, torch.Tensor]", parts["model"])
        out.append(PortableState(dict(weights), cast("NamedOptimizerState | None", parts.get("optimizer"))))
    return out


def full_optimizer_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> OptimizerStateType:
    """The optimizer's full (unsharded) state on rank 0, keyed by parameter names; ``{}`` elsewhere."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = get_optimizer_state_dict(model, optimizer, options=_gather_options(model))
    return state if dist.get_rank() == 0 else {}


def load_full_optimizer_state_dict(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: OptimizerStateType
) -> None:
    """Load a full optimizer state (present on every rank); each rank keeps its shard of it.

    An optimizer that keeps no tensors (SGD without momentum) gets its groups' settings only: torch's
    loader needs a tensor of the state to learn the device from, and there is none.

    Raises:
        ValueError: the saved state has another number of parameter groups than ``optimizer``.
    """
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    if not _holds_tensors(state.get("state", {})):
        saved_groups = cast("list[Mapping[str, object]]", list(state.get("param_groups", [])))
        if len(saved_groups) != len(optimizer.param_groups):
            raise ValueError(
                f"the checkpoint's optimizer has {len(saved_groups)} parameter groups and this one has "
                f"{len(optimizer.param_groups)}; build the optimizer as the saved run did"
            )
        for group, saved in zip(optimizer.param_groups, saved_groups, strict=True):
            group.update({key: value for key, value in saved.items() if key != "params"})
        return
    set_optimizer_state_dict(model, optimizer, state, options=_options(full_state_dict=True))


def _holds_tensors(value: object) -> bool:
    """Whether ``value`` (nested dicts, lists, tuples) holds a tensor with at least one dimension."""
    if isinstance(value, torch.Tensor):
        return value.dim() > 0
    if isinstance(value, dict):
        return any(_holds_tensors(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensors(item) for item in value)
    return False


def _folder(root: str, stem: str, index: int) -> str:
    return os.path.join(root, f"{stem}_{index}")


def save_sharded_model(model: torch.nn.Module, output_dir: str, index: int) -> str:
    """Write each rank's shard of ``model`` with ``torch.distributed.checkpoint``; return the folder.

    Inside ``save_state(async_save=True)`` the shards are only staged to host memory here; the
    asynchronous save's background thread writes them (:mod:`accelerando.checkpointing.async_dcp`).
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    folder = _folder(output_dir, MODEL_SHARDS_NAME, index)
    save_or_stage({"model": get_model_state_dict(model)}, folder)  # staged only, in an async save
    return folder


# What a DCP ``.metadata`` file may name (torch 2.4 to 2.13): DCP's own data classes, paths, sizes,
# dtypes and layouts. DCP itself reads it with a plain pickle.load, which would run any code it held.
_METADATA_TYPES = {
    "torch.distributed.checkpoint.metadata": {
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "collections": {"OrderedDict"},
    "pathlib": {"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
}


class _RefusedGlobal(pickle.UnpicklingError):
    def __init__(self, name: str) -> None:
        super().__init__(f"{name} is not DCP metadata")
        self.name = name


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata and nothing else (see ``_METADATA_TYPES``)."""

    def find_class(self, module: str, name: str) -> object:
        if name in _METADATA_TYPES.get(module, ()):
            return super().find_class(module, name)
        value = getattr(torch, name, None) if module == "torch" else None
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            return value
        raise _RefusedGlobal(f"{module}.{name}"[:80])


# A DCP ``.metadata`` larger than this is not read (it lists every tensor's chunks: megabytes at most).
MAX_METADATA_BYTES = 2**30


def _read_metadata(path: str) -> Metadata:
    """A DCP ``.metadata`` file, unpickled through the allowlist (fully only inside the opt-in).

    Raises:
        UnsafeCheckpointError: If it names anything but DCP metadata types.
        CheckpointError: If it is not a regular file (link, FIFO, device) or is above ``MAX_METADATA_BYTES``.
    """
    try:
        handle = safe_files.open_regular(path, MAX_METADATA_BYTES, follow=False)
    except (safe_files.NotRegularFileError, safe_files.FileTooLargeError) as err:
        raise CheckpointError(f"Checkpoint shards are damaged: {err}.") from None
    with handle:
        try:
            unpickler = _MetadataUnpickler(handle) if F.weights_only_default() else pickle.Unpickler(handle)
            return unpickler.load()
        except _RefusedGlobal as err:
            raise F.UnsafeCheckpointError(path, err.name) from None


def _shard_reader(folder: str) -> FileSystemReader:
    """DCP's file reader for ``folder``, with its metadata read here first, without running code from it.

    DCP reads ``.metadata`` with a plain ``pickle.load`` and wraps every error it meets; here it is
    read before DCP starts, through an allowlist (full unpickling only on the caller's opt-in,
    ``load_kwargs={"weights_only": False}``), and every shard file it names must be a plain name inside
    ``folder`` naming a regular file (no link, FIFO or device, which could hang the read), reached
    through real folders only (no folder on the way may be a link out of ``folder``); the reader
    hands DCP that metadata. Pair it with :func:`safe_load_planner`, which reads the shards' non-tensor
    items without full unpickling.

    Raises:
        UnsafeCheckpointError: If the metadata names anything else (the message names the file).
        CheckpointError: If it names a shard file outside the folder or one that is not a regular
            file, or the metadata itself is not a regular file of a sane size.
    """
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    path = os.path.join(folder, ".metadata")
    metadata = _read_metadata(path)
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        try:
            name = check_name(getattr(info, "relative_path", None))
            safe_files.check_regular_inside(folder, name)  # no link anywhere on the way
        except (ValueError, safe_files.NotRegularFileError) as err:
            raise CheckpointError(f"Checkpoint shards {folder!r} are damaged: {path!r} lists {err}") from None
        except FileNotFoundError:
            raise CheckpointError(
                f"Checkpoint shards {folder!r} are damaged: {path!r} lists {name!r}, which is missing"
            ) from None

    class Reader(FileSystemReader):
        def read_metadata(self, *args: object, **kwargs: object) -> Metadata:
            storage_meta = getattr(metadata, "storage_meta", None)
            if storage_meta is None:
                storage_meta = metadata.storage_meta = StorageMeta()
            storage_meta.load_id = self.load_id
            return metadata

    return Reader(folder)


def _load_byte_item(folder: str, planner: object, read_item: ReadItem, value: io.BytesIO) -> object:
    """One non-tensor item of a DCP checkpoint, read with ``torch.load(weights_only=True)``.

    Full unpickling only inside the caller's opt-in (``load_kwargs={"weights_only": False}``).

    Raises:
        UnsafeCheckpointError: If the item needs full unpickling (names the shard file and the type).
        CheckpointError: If the item cannot be read at all (damaged).
    """
    storage = getattr(getattr(planner, "metadata", None), "storage_data", None) or {}
    info = storage.get(read_item.storage_index)
    path = os.path.join(folder, str(getattr(info, "relative_path", "?")))
    weights_only = F.weights_only_default()
    F.bounded_archive(value, f"item {read_item.dest_index.fqn!r} of {path}")  # pyright: ignore[reportArgumentType]
    try:
        # io.BytesIO: a plain byte container (Transformer Engine's extra state in Megatron checkpoints).
        with torch.serialization.safe_globals([io.BytesIO]):
            return torch.load(value, map_location="cpu", weights_only=weights_only)
    except pickle.UnpicklingError as err:
        refused = refused_type(err) if weights_only else None
        if refused is None:
            raise CheckpointError(
                f"Checkpoint shards {folder!r} are damaged: item {read_item.dest_index.fqn!r} of {path!r} "
                f"cannot be read ({str(err)[:200]})."
            ) from None
        raise F.UnsafeCheckpointError(path, refused) from None
    except (EOFError, RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
        raise CheckpointError(
            f"Checkpoint shards {folder!r} are damaged: item {read_item.dest_index.fqn!r} of {path!r} "
            f"cannot be read ({type(err).__name__}: {str(err)[:200]})."
        ) from None


def safe_load_planner(folder: str, empty: bool = False) -> DefaultLoadPlanner:
    """A DCP load planner that reads non-tensor items without running code from the checkpoint.

    torch's ``DefaultLoadPlanner.load_bytes`` reads each non-tensor item (an optimizer's ``lr``,
    ``betas``, any Python value) with ``torch.load(weights_only=False)``: full unpickling, so a shard
    file whose ``.metadata`` points an item at a planted pickle runs its code. This planner reads them
    with ``weights_only=True`` instead (plain data only); full unpickling only inside the caller's
    opt-in. Tensors are read by the storage reader, weights-only already.

    Args:
        folder: The DCP folder (named in errors).
        empty: The planner that fills an empty dict with whatever the checkpoint holds (torch's
            ``_EmptyStateDictLoadPlanner``, for merging shards in one process) instead of the default.

    Returns:
        The planner, for ``dcp.load(..., planner=...)``.
    """
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    base: type[DefaultLoadPlanner] = DefaultLoadPlanner
    if empty:
        # torch 2.13: torch/distributed/checkpoint/default_planner.py:410 (private; load into an empty dict)
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

        base = _EmptyStateDictLoadPlanner

    class SafeLoadPlanner(base):  # type: ignore[misc, valid-type]
        def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
            loaded = _load_byte_item(folder, self, read_item, value)
            if self.flatten_state_dict:
                # torch 2.13: torch/distributed/checkpoint/_traverse.py:120 (private; set a value at its nested path)
                from torch.distributed.checkpoint._traverse import set_element

                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return SafeLoadPlanner()


@contextlib.contextmanager
def weights_only_dcp_reads(folder: str) -> Iterator[None]:
    """Within the block, every DCP read in this process is weights-only, whoever drives it.

    For libraries that run ``torch.distributed.checkpoint`` loads themselves with torch's own
    classes (megatron-core's ``dist_checkpointing.load``: ``MCoreLoadPlanner`` inherits
    ``DefaultLoadPlanner.load_bytes``, its readers ``FileSystemReader.read_metadata``), those two
    methods are replaced on the classes for the length of the block: ``.metadata`` is read through
    the DCP allowlist and non-tensor items with ``torch.load(weights_only=True)``. Nothing changes
    inside the caller's opt-in (``load_kwargs={"weights_only": False}``). The replacement is
    process-wide while it lasts: another thread's DCP load in that window is read weights-only too.

    Args:
        folder: The checkpoint folder, named in refusals.

    Raises:
        UnsafeCheckpointError: (from the block) If an item or the metadata needs full unpickling.
    """
    if not F.weights_only_default():
        yield
        return
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    def load_bytes(self: DefaultLoadPlanner, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = _load_byte_item(folder, self, read_item, value)
        if self.flatten_state_dict:
            # torch 2.13: torch/distributed/checkpoint/_traverse.py:120 (private; set a value at its nested path)
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded

    def read_metadata(self: FileSystemReader, *args: object, **kwargs: object) -> Metadata:
        where = getattr(self, "_get_metadata_path", None)  # torch >= 2.7; before: <path>/.metadata
        path = os.fspath(
            where(kwargs.get("rank")) if where else os.path.join(os.fspath(self.path), ".metadata")
        )
        metadata = _read_metadata(path)
        storage_meta = getattr(metadata, "storage_meta", None)
        if storage_meta is None:
            storage_meta = metadata.storage_meta = StorageMeta()
        storage_meta.load_id = self.load_id
        return metadata

    saved = (DefaultLoadPlanner.load_bytes, FileSystemReader.read_metadata)
    DefaultLoadPlanner.load_bytes = load_bytes  # type: ignore[method-assign]
    FileSystemReader.read_metadata = read_metadata  # type: ignore[method-assign]
    try:
        yield
    finally:
        DefaultLoadPlanner.load_bytes, FileSystemReader.read_metadata = saved  # type: ignore[method-assign]


def load_shards(state: dict[str, object], folder: str, everything: bool = False) -> None:
    """``dcp.load`` of ``folder`` into ``state`` in place, reading nothing that could run code.

    Args:
        state: The state dict to fill (its tensors are the template), or an empty dict with
            ``everything=True``.
        everything: Fill the empty ``state`` with whatever the folder holds, in this process alone
            (no process group; for merging shards).

    The metadata goes through :func:`_shard_reader`, the non-tensor items through
    :func:`safe_load_planner`. DCP wraps what a process raised while reading in a
    ``CheckpointException``; our own refusals are taken back out of it, so the caller sees the same
    :class:`UnsafeCheckpointError` (or ``CheckpointError``) as for any other file.

    Raises:
        UnsafeCheckpointError: If an item or the metadata needs full unpickling and the caller did
            not opt in (``load_kwargs={"weights_only": False}``).
        CheckpointError: If the folder is damaged.
    """
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import load

    try:
        if everything:
            # Public ``dcp.load`` returns early on an empty dict: the loader dcp_to_torch_save uses.
            # torch 2.13: torch/distributed/checkpoint/state_dict_loader.py:203 (private)
            from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

            _load_state_dict(
                state,
                storage_reader=_shard_reader(folder),
                planner=safe_load_planner(folder, empty=True),
                no_dist=True,
            )
        else:
            load(state, storage_reader=_shard_reader(folder), planner=safe_load_planner(folder))
    except CheckpointException as err:
        for failure in (getattr(err, "failures", None) or {}).values():
            cause = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(cause, CheckpointError):
                raise cause from None
        raise


def load_sharded_model(model: torch.nn.Module, input_dir: str, index: int) -> bool:
    """Load a folder written by :func:`save_sharded_model`; False when the checkpoint has none."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    folder = _folder(input_dir, MODEL_SHARDS_NAME, index)
    if not os.path.isdir(folder):
        return False
    state: dict[str, object] = {"model": get_model_state_dict(model)}
    load_shards(state, folder)
    loaded = state["model"]
    assert isinstance(loaded, dict), "DCP loads into the template in place"
    set_model_state_dict(model, loaded)
    return True


def save_sharded_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, output_dir: str, index: int
) -> str:
    """Write each rank's shard of the optimizer state; return the folder."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    folder = _folder(output_dir, OPTIMIZER_SHARDS_NAME, index)
    save_or_stage({"optimizer": get_optimizer_state_dict(model, optimizer)}, folder)
    return folder


def load_sharded_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, input_dir: str, index: int
) -> bool:
    """Load a folder written by :func:`save_sharded_optimizer`; False when the checkpoint has none."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    folder = _folder(input_dir, OPTIMIZER_SHARDS_NAME, index)
    if not os.path.isdir(folder):
        return False
    # The template holds initialised (empty) state for every parameter, so DCP knows every shape.
    state: dict[str, object] = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    load_shards(state, folder)
    loaded = state["optimizer"]
    assert isinstance(loaded, dict), "DCP loads into the template in place"
    set_optimizer_state_dict(model, optimizer, loaded)
    return True
