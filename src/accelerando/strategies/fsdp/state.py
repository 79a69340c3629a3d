"""State dicts of FSDP models and optimizers: full (gathered on rank 0) and sharded (DCP folders).

Everything goes through ``torch.distributed.checkpoint.state_dict`` so FSDP1 and FSDP2 models are
handled the same way and keys are the plain module names (no wrapper prefixes).
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import torch
import torch.distributed as dist

from accelerando.utils.constants import FSDP_MODEL_NAME, OPTIMIZER_NAME

__all__ = [
    "MODEL_SHARDS_NAME",
    "OPTIMIZER_SHARDS_NAME",
    "broadcast_buffers",
    "broadcast_full_state_dict",
    "broadcast_params",
    "full_model_state_dict",
    "full_optimizer_state_dict",
    "load_full_model_state_dict",
    "load_full_optimizer_state_dict",
    "load_sharded_model",
    "load_sharded_optimizer",
    "save_sharded_model",
    "save_sharded_optimizer",
]

# Folder names inside a checkpoint, as the reference names them (merge-weights takes the first).
MODEL_SHARDS_NAME = FSDP_MODEL_NAME
OPTIMIZER_SHARDS_NAME = OPTIMIZER_NAME


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kwargs)


def _gather_options(model: torch.nn.Module) -> Any:
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
    return _share_tied_entries(model, state)


_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def _share_tied_entries(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """Names of one tied parameter share one tensor in the gathered dict, so writers store it once."""
    from accelerando.strategies.ties import find_ties, share_tied_entries

    ties = []
    for group in find_ties(model):
        clean = []
        for name in group:
            for prefix in _WRAPPER_PREFIXES:
                name = name.replace(prefix, "")
            clean.append(name)
        ties.append(clean)
    return share_tied_entries(state, ties)


def load_full_model_state_dict(
    model: torch.nn.Module, state_dict: dict[str, Any], strict: bool = True
) -> Any:
    """Load a full state dict (present on every rank) into a sharded model."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    return set_model_state_dict(model, state_dict, options=_options(full_state_dict=True, strict=strict))


def full_optimizer_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's full (unsharded) state on rank 0, keyed by parameter names; ``{}`` elsewhere."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = get_optimizer_state_dict(model, optimizer, options=_gather_options(model))
    return state if dist.get_rank() == 0 else {}


def load_full_optimizer_state_dict(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load a full optimizer state (present on every rank); each rank keeps its shard of it."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=_options(full_state_dict=True))


def _folder(root: str, stem: str, index: int) -> str:
    return os.path.join(root, f"{stem}_{index}")


def save_sharded_model(model: torch.nn.Module, output_dir: str, index: int) -> str:
    """Write each rank's shard of ``model`` with ``torch.distributed.checkpoint``; return the folder.

    Inside ``save_state(async_save=True)`` the shards are only staged to host memory here; the
    asynchronous save's background thread writes them (:mod:`accelerando.checkpointing.async_dcp`).
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from accelerando.checkpointing.async_dcp import save_or_stage

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

    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_TYPES.get(module, ()):
            return super().find_class(module, name)
        value = getattr(torch, name, None) if module == "torch" else None
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            return value
        raise _RefusedGlobal(f"{module}.{name}"[:80])


def _shard_reader(folder: str) -> Any:
    """DCP's file reader for ``folder``, with its metadata read here first, without running code from it.

    DCP reads ``.metadata`` with a plain ``pickle.load`` and wraps every error it meets; here it is
    read before DCP starts, through an allowlist (full unpickling only on the caller's opt-in,
    ``load_kwargs={"weights_only": False}``), and every shard file it names must be a plain name inside
    ``folder``; the reader hands DCP that metadata.

    Raises:
        UnsafeCheckpointError: If the metadata names anything else (the message names the file).
        CheckpointError: If it names a shard file outside the folder.
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    from accelerando.checkpointing import files as F
    from accelerando.checkpointing.manifest import CheckpointError, check_name

    path = os.path.join(folder, ".metadata")
    with open(path, "rb") as handle:
        try:
            unpickler = _MetadataUnpickler(handle) if F.weights_only_default() else pickle.Unpickler(handle)
            metadata = unpickler.load()
        except _RefusedGlobal as err:
            raise F.UnsafeCheckpointError(path, err.name) from None
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        try:
            check_name(getattr(info, "relative_path", None))
        except ValueError as err:
            raise CheckpointError(f"Checkpoint shards {folder!r} are damaged: {path!r} lists {err}") from None

    class Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return Reader(folder)


def load_sharded_model(model: torch.nn.Module, input_dir: str, index: int) -> bool:
    """Load a folder written by :func:`save_sharded_model`; False when the checkpoint has none."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    folder = _folder(input_dir, MODEL_SHARDS_NAME, index)
    if not os.path.isdir(folder):
        return False
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, storage_reader=_shard_reader(folder))
    set_model_state_dict(model, state["model"])
    return True


def save_sharded_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, output_dir: str, index: int
) -> str:
    """Write each rank's shard of the optimizer state; return the folder."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from accelerando.checkpointing.async_dcp import save_or_stage

    folder = _folder(output_dir, OPTIMIZER_SHARDS_NAME, index)
    save_or_stage({"optimizer": get_optimizer_state_dict(model, optimizer)}, folder)
    return folder


def load_sharded_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, input_dir: str, index: int
) -> bool:
    """Load a folder written by :func:`save_sharded_optimizer`; False when the checkpoint has none."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    folder = _folder(input_dir, OPTIMIZER_SHARDS_NAME, index)
    if not os.path.isdir(folder):
        return False
    # The template holds initialised (empty) state for every parameter, so DCP knows every shape.
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, storage_reader=_shard_reader(folder))
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    return True
