"""Place each tensor of a checkpoint as it is read: on its device, into its DTensor shard, or on disk.

:class:`CheckpointLoader` holds the bookkeeping of one load (what was loaded, what was unexpected,
the disk index) and reports the result once every file was read.
"""

from __future__ import annotations

import logging
import os

import torch

from accelerando.big_modeling.budgets import DeviceLike
from accelerando.big_modeling.offload import (
    SAFETENSORS_DTYPES,
    offload_weight,
    safetensors_view,
    save_offload_index,
)
from accelerando.big_modeling.reading import device_resolver
from accelerando.big_modeling.sizes import parse_dtype
from accelerando.big_modeling.tensors import (
    set_module_tensor_to_device,
    summarize_names,
    tensors_on_meta,
    to_torch_device,
)

__all__ = ["CheckpointLoader"]

# the loading module's logger: messages keep the name they had before the split
logger = logging.getLogger("accelerando.big_modeling.loading")


def _keeps_fp32(name: str, keep_in_fp32_modules: list[str]) -> bool:
    return any(f".{module}." in f".{name}." for module in keep_in_fp32_modules)


def _is_dtensor(tensor: object) -> bool:
    return type(tensor).__name__ == "DTensor" or "DTensor" in (c.__name__ for c in type(tensor).__mro__)


class CheckpointLoader:
    """One checkpoint load: the bookkeeping shared by every tensor."""

    def __init__(self, model, device_map, offload_folder, dtype, offload_buffers, keep_in_fp32_modules):
        self.model = model
        self.resolve = device_resolver(device_map)
        self.offload_folder = offload_folder
        self.dtype = parse_dtype(dtype)
        self.keep_fp32 = list(keep_in_fp32_modules or [])
        self.buffers = {name for name, _ in model.named_buffers()}
        self.offload_buffers = offload_buffers
        self.expected = set(model.state_dict().keys())
        self.loaded: set[str] = set()
        self.unexpected: list[str] = []
        self.index: dict[str, dict] = {}
        self.devices: dict[DeviceLike, torch.device] = {}
        self.full_state_dict = True
        self.checkpoint = ""
        # Parameters already sharded across processes (FSDP2 / tensor parallel DTensors).
        self.sharded = {name: t for name, t in model.state_dict(keep_vars=True).items() if _is_dtensor(t)}

    def cast_for(self, name: str, tensor_dtype: torch.dtype) -> torch.dtype | None:
        """The dtype a tensor is cast to while loading: float32 for kept modules, else ``dtype``; None keeps it."""
        if not tensor_dtype.is_floating_point:
            return None
        if self.keep_fp32 and _keeps_fp32(name, self.keep_fp32):
            return torch.float32
        return self.dtype if isinstance(self.dtype, torch.dtype) else None

    def place(self, name: str, tensor: torch.Tensor | None, source: tuple[str, dict] | None) -> None:
        """Put one checkpoint tensor where it belongs (``tensor`` None: it stays in ``source``'s file).

        Raises:
            ValueError: for a disk-mapped tensor without an offload folder, or a DTensor shape mismatch.
        """
        if name not in self.expected:
            self.unexpected.append(name)
            return
        if name in self.sharded:
            self.place_sharded(name, tensor, source)
            return
        device = self.resolve(name)
        if device == "disk" and name in self.buffers and not self.offload_buffers:
            device = "cpu"  # buffers of offloaded modules stay in memory unless asked otherwise
        if device == "disk":
            self.to_disk(name, tensor, source)
        else:
            if tensor is None:
                assert source is not None  # a tensor left in its file always comes with its source
                tensor = safetensors_view(source[0], name).clone()
            if device not in self.devices:
                self.devices[device] = to_torch_device(device)
            set_module_tensor_to_device(
                self.model, name, self.devices[device], value=tensor, dtype=self.cast_for(name, tensor.dtype)
            )
        self.loaded.add(name)

    def place_sharded(self, name: str, tensor: torch.Tensor | None, source: tuple[str, dict] | None) -> None:
        """Fill a DTensor parameter: from the full tensor (each process keeps its shard) or, with
        ``full_state_dict=False``, from a checkpoint that holds exactly this process's local shard.
        """
        if tensor is None:
            assert source is not None  # a tensor left in its file always comes with its source
            tensor = safetensors_view(source[0], name)
        current = self.sharded[name]
        local = current.to_local()
        if self.full_state_dict:
            from torch.distributed.tensor import distribute_tensor

            if tuple(tensor.shape) != tuple(current.shape):
                raise ValueError(
                    f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(current.shape)}"
                )
            # Every process read the full tensor: slice locally, no communication (src_data_rank=None).
            piece = distribute_tensor(
                tensor.to(device=local.device, dtype=local.dtype),
                current.device_mesh,
                current.placements,
                src_data_rank=None,
            ).to_local()
        else:
            if tuple(tensor.shape) != tuple(local.shape):
                raise ValueError(
                    f"{name}: full_state_dict=False expects this process's shard of shape {tuple(local.shape)}, "
                    f"the checkpoint holds {tuple(tensor.shape)}; pass full_state_dict=True for a full checkpoint"
                )
            piece = tensor
        with torch.no_grad():
            local.copy_(piece.to(device=local.device, dtype=local.dtype))
        self.loaded.add(name)

    def to_disk(self, name: str, tensor: torch.Tensor | None, source: tuple[str, dict] | None) -> None:
        """Index a tensor in place in its safetensors file, or write it to the offload folder.

        Raises:
            ValueError: if the tensor must be written and no offload folder was given.
        """
        if source is not None:
            path, entry = source
            stored = SAFETENSORS_DTYPES[entry["dtype"]]
            cast = self.cast_for(name, stored)
            self.index[name] = {
                "safetensors_file": os.path.abspath(path),
                "weight_name": name,
                "dtype": str(cast or stored).removeprefix("torch."),
                "shape": entry["shape"],
            }
            return
        if self.offload_folder is None:
            raise ValueError(f"{name!r} is mapped to 'disk': pass offload_folder to say where to write it.")
        assert tensor is not None  # without a source the tensor itself was read
        cast = self.cast_for(name, tensor.dtype)
        offload_weight(
            tensor if cast is None else tensor.to(cast), name, self.offload_folder, index=self.index
        )

    def finish(self, strict: bool) -> tuple[list[str], list[str]]:
        """Save the disk index and report ``(missing_keys, unexpected_keys)`` (a warning lists them).

        Raises:
            ValueError: for disk-mapped tensors without an offload folder, or, with ``strict``, any
                missing or unexpected key.
        """
        if self.index:
            if self.offload_folder is None:
                raise ValueError(
                    "Some weights are mapped to 'disk': pass offload_folder to keep their index."
                )
            save_offload_index(self.index, self.offload_folder)
        missing = sorted(self.expected - self.loaded)
        if strict and (missing or self.unexpected):
            raise ValueError(
                f"The checkpoint {self.checkpoint} does not match the model: {len(missing)} missing key(s) "
                f"[{summarize_names(missing)}], {len(self.unexpected)} unexpected key(s) "
                f"[{summarize_names(self.unexpected)}]. Fix the checkpoint or model configuration, or pass "
                "strict=False."
            )
        if self.unexpected:
            logger.warning(
                f"Some weights of the model checkpoint at {self.checkpoint} were not used when initializing "
                f"{type(self.model).__name__}: {set(self.unexpected)}. This may or may not be an issue - make sure "
                "that the checkpoint does not have unnecessary parameters, or that the model definition correctly "
                "corresponds to the checkpoint."
            )
        if missing:
            empty = set(tensors_on_meta(self.model))
            still_empty = [name for name in missing if name in empty]
            logger.warning(
                "Checkpoint %s loaded with missing keys [%s].%s",
                self.checkpoint,
                summarize_names(missing),
                f" {len(still_empty)} missing tensor(s) hold no data (still on the meta device) and must be set "
                "before the model runs."
                if still_empty
                else "",
            )
        return missing, list(self.unexpected)
