"""FSDP helpers of the public API: shard or load a model outside ``prepare``, merge sharded checkpoints.

``torch.distributed.fsdp`` and ``torch.distributed.checkpoint`` are imported inside the functions
that need them, so importing this module stays cheap.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping

import torch

from accelerando.backends.model_io import write_model_weights
from accelerando.backends.strategies.fsdp.state import broadcast_full_state_dict, load_shards
from accelerando.backends.strategies.fsdp.strategy import FSDPStrategy
from accelerando.checkpointing import files as F

__all__ = [
    "fsdp2_load_full_state_dict",
    "fsdp2_prepare_model",
    "load_sharded_checkpoint",
    "merge_fsdp_weights",
]

logger = logging.getLogger(__name__)


def fsdp2_prepare_model(accelerator: object, model: torch.nn.Module) -> torch.nn.Module:
    """Shard ``model`` with FSDP2 (``fully_shard``) the way ``accelerator.prepare`` would.

    Wraps each layer chosen by the plugin's auto-wrap policy, then the root, applying activation
    checkpointing, mixed precision, CPU offload and RAM-efficient loading as configured.

    Args:
        accelerator: an ``Accelerator`` using FSDP.
        model: the plain model.

    Returns:
        The same module, now sharded (its parameters are DTensors).

    Raises:
        ValueError: the accelerator does not use FSDP2.
    """
    strategy = getattr(accelerator, "_strategy", None)
    if not isinstance(strategy, FSDPStrategy) or strategy.plugin.fsdp_version != 2:
        raise ValueError("fsdp2_prepare_model needs an Accelerator configured for FSDP2 (fsdp_version=2)")
    return strategy.prepare_model(model, device_placement=True)


def fsdp2_load_full_state_dict(
    accelerator: object, model: torch.nn.Module, full_sd: dict[str, torch.Tensor], cpu_offload: bool = False
) -> None:
    """Load a full (unsharded) state dict into an FSDP2-sharded ``model``.

    Only rank 0 needs real tensors in ``full_sd`` (the others may pass an empty dict or meta
    tensors): rank 0's values are broadcast and each process keeps its shard.

    Args:
        accelerator: the ``Accelerator`` (its process state decides who is rank 0).
        model: the sharded model.
        full_sd: the full state dict (meaningful on rank 0).
        cpu_offload: keep the loaded shards in CPU memory.
    """
    del accelerator  # the process group is the default one
    broadcast_full_state_dict(model, full_sd, cpu_offload=cpu_offload)


# ------------------------------------------------------------------------------- merging shards
def load_sharded_checkpoint(checkpoint_dir: str) -> dict[str, torch.Tensor]:
    """Read a ``torch.distributed.checkpoint`` folder into one flat state dict, in one process.

    Args:
        checkpoint_dir: a folder written by ``save_state`` with SHARDED_STATE_DICT
            (``pytorch_model_fsdp_<i>``) or any DCP folder.

    Returns:
        ``name -> tensor`` (a top-level ``"model"`` entry is unwrapped).

    Non-tensor items and the metadata are read weights-only (plain data); run it inside
    ``accelerando.checkpointing.files.unpickling(False)`` to unpickle them fully (trusted folders only).

    Raises:
        FileNotFoundError: the folder has no DCP metadata.
        UnsafeCheckpointError: an item or the metadata needs full unpickling (could run code).
        CheckpointError: the folder is damaged (a shard file missing, not a regular file, unreadable).
    """
    if not os.path.isfile(os.path.join(checkpoint_dir, ".metadata")):
        raise FileNotFoundError(
            f"{checkpoint_dir!r} is not a sharded checkpoint (no .metadata file); pass the "
            "pytorch_model_fsdp_<i> folder inside a save_state checkpoint"
        )

    state: dict[str, object] = {}
    # torch's own reader and planner would unpickle the metadata and the non-tensor items fully.
    load_shards(state, checkpoint_dir, everything=True)
    if set(state) == {"model"} and isinstance(state["model"], dict):
        state = state["model"]
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def merge_fsdp_weights(
    checkpoint_dir: str,
    output_path: str,
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
    max_shard_size: int | str = "10GB",
    load_kwargs: Mapping[str, object] | None = None,
) -> str:
    """Merge a sharded FSDP checkpoint into full weights (``model.safetensors`` or ``pytorch_model.bin``).

    Runs in a single process, no process group needed. Above ``max_shard_size`` the weights are
    split into several files with an index.

    Args:
        checkpoint_dir: the sharded folder (``pytorch_model_fsdp_<i>`` of a checkpoint).
        output_path: folder to write the merged weights into (created).
        safe_serialization: safetensors (True) or ``torch.save``.
        remove_checkpoint_dir: delete ``checkpoint_dir`` after a successful merge.
        max_shard_size: largest file size before splitting (bytes or "10GB").
        load_kwargs: ``{"weights_only": False}`` unpickles the checkpoint's non-tensor items fully,
            which runs any code a hostile checkpoint holds: only for checkpoints you trust (the same
            opt-in as ``load_state``). By default they are read as plain data only.

    Returns:
        ``output_path``.

    Raises:
        FileNotFoundError: ``checkpoint_dir`` is not a sharded checkpoint.
        UnsafeCheckpointError: an item needs full unpickling and ``load_kwargs`` does not opt in.
        CheckpointError: the folder is damaged.
    """
    weights_only = bool((load_kwargs or {}).get("weights_only", True))
    try:
        with F.unpickling(weights_only):
            state_dict = load_sharded_checkpoint(checkpoint_dir)
    except F.UnsafeCheckpointError as err:
        err.args = (
            f"Refused to merge {checkpoint_dir!r}: {err.path!r} holds {err.refused}, which only full "
            "unpickling can rebuild, and unpickling can run code hidden in the file. If you trust this "
            f"checkpoint, pass {F.OPT_IN} to merge_fsdp_weights (accelerando merge-weights "
            "--trust_checkpoint).",
        )
        raise
    os.makedirs(output_path, exist_ok=True)
    write_model_weights(state_dict, output_path, max_shard_size, safe_serialization)
    logger.info("merged %d tensors from %s into %s", len(state_dict), checkpoint_dir, output_path)
    if remove_checkpoint_dir:
        shutil.rmtree(checkpoint_dir)
    return output_path
