"""The files of a checkpoint folder: their names, and how each kind of state is written and read.

Names follow the reference project so folders look familiar: ``model.safetensors`` (or
``pytorch_model.bin``), ``model_1.safetensors``, ``optimizer.bin``, ``scheduler.bin``,
``dl_state_dict.bin`` / ``sampler.bin``, ``scaler.pt``, ``random_states_<rank>.pkl``,
``custom_checkpoint_<i>.pkl``. Accumulated gradients of an unfinished accumulation cycle go in
``gradients_<rank>.safetensors`` (gradients differ per rank until they are all-reduced).
"""

from __future__ import annotations

import logging
import os
import pickle
import zipfile
from typing import Any

import torch

__all__ = [
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "SCHEDULER_NAME",
    "SAMPLER_NAME",
    "DATALOADER_STATE_NAME",
    "SCALER_NAME",
    "RNG_STATE_NAME",
    "CUSTOM_NAME",
    "GRADIENTS_NAME",
    "indexed",
    "model_file",
    "torch_load",
    "torch_save",
]

logger = logging.getLogger(__name__)

MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
DATALOADER_STATE_NAME = "dl_state_dict"
SCALER_NAME = "scaler.pt"
RNG_STATE_NAME = "random_states"
CUSTOM_NAME = "custom_checkpoint"
GRADIENTS_NAME = "gradients"


def indexed(stem: str, index: int, suffix: str) -> str:
    """``stem.suffix`` for the first object, ``stem_<index>.suffix`` for the others."""
    return f"{stem}{suffix}" if index == 0 else f"{stem}_{index}{suffix}"


def model_file(index: int, safe_serialization: bool) -> str:
    """File name of the ``index``-th model's weights."""
    if safe_serialization:
        return indexed(SAFE_MODEL_NAME, index, ".safetensors")
    return indexed(MODEL_NAME, index, ".bin")


def torch_save(obj: Any, path: str) -> None:
    """``torch.save`` to ``path`` (durability is handled by the commit step)."""
    torch.save(obj, path)  # a path, not a Python file object: torch's C++ writer is faster


# Files at least this big are read through a memory map when the caller copies their tensors
# elsewhere anyway (see state_io.load_optimizer_state): no fresh allocation, no second copy.
MAPPED_LOAD_MIN_BYTES = 16 * 2**20


def torch_load(path: str, map_location: Any = None, mapped: bool = False) -> Any:
    """``torch.load`` with ``weights_only=True``, falling back to full unpickling.

    The fallback only runs for files inside checkpoint folders, which accelerando wrote and verified
    against their manifest; it exists for state dicts holding objects the restricted unpickler does
    not know (some schedulers and user objects).

    Args:
        mapped: For a file of at least ``MAPPED_LOAD_MIN_BYTES``, return tensors backed by a private,
            read-only-on-disk memory map of the file (``torch.load(mmap=True)``) instead of fresh
            memory. The caller must copy or clone them before the file may go away.
    """
    # Legacy (non-zip) torch.save files cannot be memory-mapped.
    if mapped and os.path.getsize(path) >= MAPPED_LOAD_MIN_BYTES and zipfile.is_zipfile(path):
        try:
            return _load(path, map_location, mmap=True)
        except (OSError, RuntimeError, ValueError) as err:  # e.g. a file system that cannot map files
            logger.debug("memory-mapped load of %s failed (%s); reading it instead", path, err)
    return _load(path, map_location, mmap=False)


def _load(path: str, map_location: Any, mmap: bool) -> Any:
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        logger.debug("%s needs full unpickling (it holds non-tensor objects)", path)
        return torch.load(path, map_location=map_location, weights_only=False, mmap=mmap)


def save_model_weights(state_dict: dict[str, Any], path: str, safe_serialization: bool) -> None:
    """Write one model's weights (safetensors or ``torch.save``)."""
    if safe_serialization:
        from safetensors.torch import save_file

        from accelerando.utils.serialization import clean_state_dict_for_safetensors

        cleaned = clean_state_dict_for_safetensors(state_dict)
        save_file({k: v.detach() for k, v in cleaned.items()}, path, metadata={"format": "pt"})
    else:
        torch_save(state_dict, path)


def load_model_weights(path: str, map_location: Any = None) -> dict[str, Any]:
    """Read one model's weights written by :func:`save_model_weights`."""
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path, device="cpu" if map_location is None else str(map_location))
    return torch_load(path, map_location=map_location if map_location is not None else "cpu")


def find_model_file(folder: str, index: int) -> str:
    """Path of the ``index``-th model's weights in ``folder``, whichever format was used.

    Raises:
        FileNotFoundError: Naming both candidate files when neither exists.
    """
    safe = os.path.join(folder, model_file(index, True))
    if os.path.exists(safe):
        return safe
    unsafe = os.path.join(folder, model_file(index, False))
    if os.path.exists(unsafe):
        return unsafe
    raise FileNotFoundError(
        f"Checkpoint {folder!r} has no weights for model {index}: neither {os.path.basename(safe)!r} nor "
        f"{os.path.basename(unsafe)!r} exists. Pass the same models to load_state as to save_state."
    )
