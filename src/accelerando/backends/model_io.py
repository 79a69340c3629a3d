"""Writing a model's weights: safetensors by default, sharded with an index above a size limit.

Shard names and the index layout follow the convention transformers uses
(``model-00001-of-00003.safetensors`` + ``model.safetensors.index.json``), so the folder loads with
either library.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TypeVar

import torch

from accelerando.big_modeling.budgets import convert_file_size_to_int

__all__ = ["shard_state_dict", "write_model_weights"]

V = TypeVar("V")


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def shard_state_dict(
    state_dict: dict[str, torch.Tensor], max_shard_size: int
) -> list[dict[str, torch.Tensor]]:
    """Split ``state_dict`` into consecutive shards of at most ``max_shard_size`` bytes each.

    A tensor larger than the limit gets a shard of its own.
    """
    shards: list[dict[str, torch.Tensor]] = [{}]
    current = 0
    for name, tensor in state_dict.items():
        size = _nbytes(tensor) if isinstance(tensor, torch.Tensor) else 0
        if shards[-1] and current + size > max_shard_size:
            shards.append({})
            current = 0
        shards[-1][name] = tensor
        current += size
    return shards


def _dedupe_shared(state_dict: Mapping[str, V]) -> dict[str, V]:
    """Drop names whose tensor shares storage with an earlier one (tied weights); safetensors
    refuses shared tensors, and loaders re-tie them.
    """
    seen: set[tuple[int, int | torch.SymInt, tuple[int, ...]]] = set()
    result: dict[str, V] = {}
    for name, tensor in state_dict.items():
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
            if key in seen:
                continue
            seen.add(key)
        result[name] = tensor
    return result


def write_model_weights(
    state_dict: dict[str, torch.Tensor],
    save_directory: str,
    max_shard_size: int | str = "10GB",
    safe_serialization: bool = True,
) -> list[str]:
    """Write ``state_dict`` into ``save_directory``; return the file names written.

    Tied (storage-sharing) tensors are stored once. Above ``max_shard_size`` the weights are
    split into shards plus an index JSON mapping each tensor name to its file.

    Raises:
        ValueError: ``save_directory`` is an existing file.
    """
    if os.path.isfile(save_directory):
        raise ValueError(f"save_directory {save_directory!r} is a file; pass a folder path")
    os.makedirs(save_directory, exist_ok=True)
    weights = _dedupe_shared(state_dict) if safe_serialization else state_dict
    weights = {k: (v.contiguous() if isinstance(v, torch.Tensor) else v) for k, v in weights.items()}
    stem, ext = ("model", ".safetensors") if safe_serialization else ("pytorch_model", ".bin")

    shards = shard_state_dict(weights, convert_file_size_to_int(max_shard_size))
    names = (
        [f"{stem}{ext}"]
        if len(shards) == 1
        else [f"{stem}-{i + 1:05d}-of-{len(shards):05d}{ext}" for i in range(len(shards))]
    )
    for name, shard in zip(names, shards, strict=True):
        path = os.path.join(save_directory, name)
        if safe_serialization:
            from safetensors.torch import save_file

            save_file(shard, path, metadata={"format": "pt"})
        else:
            torch.save(shard, path)
    if len(shards) > 1:
        index = {
            "metadata": {
                "total_size": sum(_nbytes(t) for t in weights.values() if isinstance(t, torch.Tensor))
            },
            "weight_map": {key: name for name, shard in zip(names, shards, strict=True) for key in shard},
        }
        index_name = f"{stem}{ext}.index.json"
        with open(os.path.join(save_directory, index_name), "w", encoding="utf-8") as fh:
            json.dump(index, fh, indent=2, sort_keys=True)
        names.append(index_name)
    return names
