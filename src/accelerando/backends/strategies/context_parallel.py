"""Context parallelism (torch's ``context_parallel``): where it can run, and its context manager.

torch shards the sequence dimension of attention inputs across the ``cp`` mesh axis and swaps
``scaled_dot_product_attention`` for ring attention. Its sharding rules exist only for the CUDA
attention kernels (flash / memory-efficient / cuDNN); on CPU torch fails deep inside attention with
"aten._scaled_dot_product_flash_attention_for_cpu does not have a sharding strategy", so this module
refuses CPU up front with the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from accelerando.parallelism_config import ParallelismConfig

__all__ = ["check_context_parallel_device", "context_parallel_context", "maybe_context_parallel"]

_CPU_REASON = (
    "torch's context parallelism shards attention through the CUDA attention kernels (flash / "
    "memory-efficient / cuDNN); the CPU kernel aten._scaled_dot_product_flash_attention_for_cpu has no "
    "sharding strategy"
)


def check_context_parallel_device(cp_size: int, device_type: str) -> None:
    """Refuse context parallelism where torch cannot run it.

    Args:
        cp_size: the ``cp`` degree of the ParallelismConfig.
        device_type: the processes' device type (``"cuda"``, ``"cpu"``, ...).

    Raises:
        ValueError: ``cp_size > 1`` on a device other than CUDA (the message gives the reason and the fix).
    """
    if cp_size > 1 and device_type != "cuda":
        raise ValueError(
            f"ParallelismConfig(cp_size={cp_size}) asks for context parallelism on {device_type!r} devices: "
            f"{_CPU_REASON}. Fix: run on CUDA GPUs, or use cp_size=1 (for long sequences on CPU use "
            "gradient checkpointing or a smaller sequence length)"
        )


@contextlib.contextmanager
def context_parallel_context(
    mesh: DeviceMesh,
    buffers: Sequence[torch.Tensor] | None = None,
    buffer_seq_dims: Sequence[int] | None = None,
    no_restore_buffers: set[torch.Tensor] | None = None,
    rotate_method: str | None = None,
) -> Iterator[None]:
    """Shard ``buffers`` along their sequence dims over the ``cp`` axis of ``mesh`` for the block.

    Args:
        mesh: the job's DeviceMesh (with a ``"cp"`` axis) or its ``cp`` sub-mesh.
        buffers: tensors to shard in place (inputs, labels, position ids, ...).
        buffer_seq_dims: the sequence dimension of each buffer.
        no_restore_buffers: buffers not restored to their full length on exit.
        rotate_method: ``"allgather"`` or ``"alltoall"`` (torch's ring-attention rotation).

    Raises:
        ValueError: on a non-CUDA mesh (see :func:`check_context_parallel_device`), or a mesh without
            a ``cp`` axis.
    """
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    cp_mesh = mesh["cp"] if "cp" in names else mesh
    if "cp" not in names and names != ("cp",):
        raise ValueError(f"context parallelism needs a mesh with a 'cp' axis, got axes {names}")
    check_context_parallel_device(int(cp_mesh.size()), str(cp_mesh.device_type))
    from torch.distributed.tensor.experimental import context_parallel

    # torch 2.13: torch/distributed/tensor/experimental/_context_parallel/_attention.py:1693 (private; no public setter)
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    if rotate_method is not None:
        set_rotate_method(rotate_method)
    with context_parallel(
        cp_mesh,
        buffers=list(buffers or []),
        buffer_seq_dims=list(buffer_seq_dims or []),
        no_restore_buffers=set(no_restore_buffers or ()),
    ):
        yield


def maybe_context_parallel(
    parallelism_config: ParallelismConfig | None,
    mesh: DeviceMesh | None,
    device_type: str,
    buffers: Sequence[torch.Tensor] | None = None,
    buffer_seq_dims: Sequence[int] | None = None,
    no_restore_buffers: set[torch.Tensor] | None = None,
) -> contextlib.AbstractContextManager[None]:
    """``Accelerator.maybe_context_parallel``: a no-op without ``cp_size > 1``, else torch's context parallelism.

    Args:
        parallelism_config: the job's ``ParallelismConfig`` (None without one).
        mesh: the job's DeviceMesh (with a ``"cp"`` axis when ``cp_size > 1``).
        device_type: the processes' device type.
        buffers, buffer_seq_dims, no_restore_buffers: see :func:`context_parallel_context`.

    Raises:
        ValueError: ``cp_size > 1`` on a device other than CUDA (the message says why and the fix).
    """
    cp_size = getattr(parallelism_config, "cp_size", 1) if parallelism_config is not None else 1
    if cp_size <= 1:
        return contextlib.nullcontext()
    check_context_parallel_device(cp_size, device_type)
    if mesh is None:
        raise ValueError("context parallelism needs a mesh with a 'cp' axis, got axes ()")
    handler = getattr(parallelism_config, "cp_handler", None)
    return context_parallel_context(
        mesh,
        buffers=buffers,
        buffer_seq_dims=buffer_seq_dims,
        no_restore_buffers=no_restore_buffers,
        rotate_method=getattr(handler, "cp_comm_strategy", None),
    )
