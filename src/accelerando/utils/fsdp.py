"""FSDP helpers: RAM-efficient loading switches, full-state-dict loading, merging sharded checkpoints,
and the automatic choice of a sharding strategy from model size and device memory.

``torch.distributed.fsdp`` and ``torch.distributed.checkpoint`` are imported inside the functions
that need them, so importing this module stays cheap.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "ShardingChoice",
    "choose_sharding_strategy",
    "disable_fsdp_ram_efficient_loading",
    "enable_fsdp_ram_efficient_loading",
    "estimate_sharding_memory",
    "fsdp2_load_full_state_dict",
    "fsdp2_prepare_model",
    "load_sharded_checkpoint",
    "merge_fsdp_weights",
]

logger = logging.getLogger(__name__)

# The variables transformers' ``from_pretrained`` reads to decide whether only rank 0 materialises
# weights; both the reference's names and ours are set so either reader sees the switch.
_RAM_EFFICIENT_VARS = ("FSDP_CPU_RAM_EFFICIENT_LOADING", "ACCELERANDO_FSDP_CPU_RAM_EFFICIENT_LOADING")
_USE_FSDP_VARS = ("ACCELERATE_USE_FSDP", "ACCELERANDO_USE_FSDP")


def enable_fsdp_ram_efficient_loading() -> None:
    """Make transformers' ``from_pretrained`` load weights on rank 0 only (others get empty weights).

    Sets the FSDP RAM-efficient-loading environment switch (and the FSDP switch when unset) that
    ``transformers`` reads; the strategy then broadcasts rank 0's weights when it wraps the model.
    Writing the environment is the point of this function: it is the interface transformers reads.
    """
    for name in _USE_FSDP_VARS:
        os.environ.setdefault(name, "true")
    for name in _RAM_EFFICIENT_VARS:
        os.environ[name] = "true"


def disable_fsdp_ram_efficient_loading() -> None:
    """Undo :func:`enable_fsdp_ram_efficient_loading`: every rank loads full weights again."""
    for name in _RAM_EFFICIENT_VARS:
        os.environ[name] = "false"


# ------------------------------------------------------------------------------- automatic choice
@dataclass(frozen=True)
class ShardingChoice:
    """The outcome of :func:`choose_sharding_strategy`.

    Attributes:
        strategy: NO_SHARD, SHARD_GRAD_OP or FULL_SHARD.
        cpu_offload: whether sharded state lives in CPU memory.
        bytes_per_process: estimated device bytes per process for the choice.
        budget_bytes: usable device bytes per process (memory minus headroom).
        reason: one line per candidate considered, saying why it was taken or skipped.
    """

    strategy: str
    cpu_offload: bool
    bytes_per_process: int
    budget_bytes: int
    reason: str


_CANDIDATES = (("NO_SHARD", False), ("SHARD_GRAD_OP", False), ("FULL_SHARD", False), ("FULL_SHARD", True))


def estimate_sharding_memory(
    num_params: int,
    num_processes: int,
    strategy: str,
    *,
    cpu_offload: bool = False,
    compute_bytes: int = 4,
    optimizer_bytes_per_param: int = 8,
    largest_unit_params: int = 0,
) -> int:
    """Estimate device bytes per process for model state under one sharding strategy.

    The model: each parameter has an fp32 master copy (4 bytes), an fp32 gradient (4 bytes) and
    ``optimizer_bytes_per_param`` of optimizer state (8 for Adam's two moments); this "state" is
    replicated (NO_SHARD) or divided by ``num_processes``. Computation needs parameters gathered in
    ``compute_bytes`` each: all of them between forward and backward for SHARD_GRAD_OP, two wrapped
    units at a time (current + prefetched) for FULL_SHARD. A low-precision compute copy adds to
    NO_SHARD too. Activations are not counted: that is what the headroom is for.

    Args:
        num_params: parameters of the model.
        num_processes: processes sharing the state.
        strategy: NO_SHARD, SHARD_GRAD_OP or FULL_SHARD.
        cpu_offload: sharded state in CPU memory (only the gathered units stay on the device).
        compute_bytes: bytes of a parameter as computed (2 under a bf16/fp16 parameter policy).
        optimizer_bytes_per_param: optimizer state bytes per parameter.
        largest_unit_params: parameters of the largest wrapped unit.

    Returns:
        Estimated bytes per process.

    Raises:
        ValueError: an unknown strategy or non-positive process count.
    """
    if num_processes < 1:
        raise ValueError(f"num_processes={num_processes} must be >= 1")
    state = num_params * (4 + 4 + optimizer_bytes_per_param)
    gathered_units = 2 * largest_unit_params * compute_bytes
    if strategy == "NO_SHARD":
        return state + (num_params * compute_bytes if compute_bytes != 4 else 0)
    if strategy == "SHARD_GRAD_OP":
        return state // num_processes + num_params * compute_bytes
    if strategy == "FULL_SHARD":
        return gathered_units + (0 if cpu_offload else state // num_processes)
    raise ValueError(f"strategy={strategy!r}; estimate NO_SHARD, SHARD_GRAD_OP or FULL_SHARD")


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.3g} GiB"


def choose_sharding_strategy(
    num_params: int,
    num_processes: int,
    device_memory_bytes: int,
    *,
    compute_bytes: int = 4,
    optimizer_bytes_per_param: int = 8,
    largest_unit_params: int = 0,
    headroom: float = 0.2,
    cpu_memory_bytes: int | None = None,
) -> ShardingChoice:
    """Pick the least sharding whose estimated memory fits each device.

    Candidates, in order: NO_SHARD (no communication beyond DDP's), SHARD_GRAD_OP, FULL_SHARD,
    FULL_SHARD with CPU offload. The first whose estimate (see :func:`estimate_sharding_memory`)
    fits in ``device_memory_bytes * (1 - headroom)`` wins.

    Args:
        num_params: parameters of the model.
        num_processes: processes sharing the model.
        device_memory_bytes: memory of one process's device.
        compute_bytes: bytes per parameter as computed (2 for a bf16/fp16 parameter policy).
        optimizer_bytes_per_param: optimizer state bytes per parameter (8 for Adam, 4 for SGD with
            momentum, 0 for plain SGD).
        largest_unit_params: parameters of the largest wrapped unit.
        headroom: fraction of device memory kept for activations and allocator slack.
        cpu_memory_bytes: CPU memory per process available for offloaded state (None = unknown,
            offload assumed to fit).

    Returns:
        The :class:`ShardingChoice`, with a reason naming every candidate considered.

    Raises:
        ValueError: invalid arguments, or nothing fits (the message gives the sizes and what to do).
    """
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom={headroom} must be in [0, 1)")
    if device_memory_bytes <= 0 or num_params < 0:
        raise ValueError("device_memory_bytes must be > 0 and num_params >= 0")
    budget = int(device_memory_bytes * (1.0 - headroom))
    lines = []
    for strategy, offload in _CANDIDATES:
        need = estimate_sharding_memory(
            num_params,
            num_processes,
            strategy,
            cpu_offload=offload,
            compute_bytes=compute_bytes,
            optimizer_bytes_per_param=optimizer_bytes_per_param,
            largest_unit_params=largest_unit_params,
        )
        label = strategy + (" + CPU offload" if offload else "")
        if offload and cpu_memory_bytes is not None:
            host_need = num_params * (8 + optimizer_bytes_per_param) // num_processes
            if host_need > cpu_memory_bytes:
                lines.append(
                    f"{label}: needs {_gib(host_need)} of CPU memory per process > {_gib(cpu_memory_bytes)}"
                )
                continue
        if need <= budget:
            lines.append(f"{label}: needs {_gib(need)} per process <= {_gib(budget)} usable: chosen")
            return ShardingChoice(strategy, offload, need, budget, "; ".join(lines))
        lines.append(f"{label}: needs {_gib(need)} per process > {_gib(budget)} usable")
    raise ValueError(
        f"a model of {num_params:,} parameters does not fit {num_processes} process(es) with "
        f"{_gib(device_memory_bytes)} each ({'; '.join(lines)}); use more processes, a bf16 parameter "
        "policy, a smaller optimizer state, or set a sharding strategy explicitly"
    )


# ---------------------------------------------------------------------------- model preparation
def fsdp2_prepare_model(accelerator: Any, model: torch.nn.Module) -> torch.nn.Module:
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
    from accelerando.strategies.fsdp import FSDPStrategy

    strategy = getattr(accelerator, "_strategy", None)
    if not isinstance(strategy, FSDPStrategy) or strategy.plugin.fsdp_version != 2:
        raise ValueError("fsdp2_prepare_model needs an Accelerator configured for FSDP2 (fsdp_version=2)")
    return strategy.prepare_model(model, device_placement=True)


def fsdp2_load_full_state_dict(
    accelerator: Any, model: torch.nn.Module, full_sd: dict[str, torch.Tensor], cpu_offload: bool = False
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
    from accelerando.strategies.fsdp.state import broadcast_full_state_dict

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

    Raises:
        FileNotFoundError: the folder has no DCP metadata.
    """
    if not os.path.isfile(os.path.join(checkpoint_dir, ".metadata")):
        raise FileNotFoundError(
            f"{checkpoint_dir!r} is not a sharded checkpoint (no .metadata file); pass the "
            "pytorch_model_fsdp_<i> folder inside a save_state checkpoint"
        )
    import torch.distributed.checkpoint as dcp

    state: dict[str, Any] = {}
    try:
        # The planner that fills an empty dict with whatever the checkpoint holds; public
        # ``dcp.load`` returns early on an empty dict, so the loader dcp_to_torch_save uses is called.
        from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner, _load_state_dict
    except ImportError:  # a torch without the private loader: go through a temporary torch.save file
        import tempfile

        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            dcp_to_torch_save(checkpoint_dir, os.path.join(tmp, "full.pt"))
            state = torch.load(os.path.join(tmp, "full.pt"), weights_only=True)
    else:
        _load_state_dict(
            state,
            storage_reader=dcp.FileSystemReader(checkpoint_dir),
            planner=_EmptyStateDictLoadPlanner(),
            no_dist=True,
        )
    if set(state) == {"model"} and isinstance(state["model"], dict):
        state = state["model"]
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def merge_fsdp_weights(
    checkpoint_dir: str,
    output_path: str,
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
    max_shard_size: int | str = "10GB",
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

    Returns:
        ``output_path``.

    Raises:
        FileNotFoundError: ``checkpoint_dir`` is not a sharded checkpoint.
    """
    from accelerando.model_io import write_model_weights

    state_dict = load_sharded_checkpoint(checkpoint_dir)
    os.makedirs(output_path, exist_ok=True)
    write_model_weights(state_dict, output_path, max_shard_size, safe_serialization)
    logger.info("merged %d tensors from %s into %s", len(state_dict), checkpoint_dir, output_path)
    if remove_checkpoint_dir:
        shutil.rmtree(checkpoint_dir)
    return output_path
