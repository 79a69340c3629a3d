"""Pipeline x data parallelism: the layout arithmetic, the 2-D mesh and the gradient all-reduce.

A job of ``N`` processes with ``pp_size`` stages runs ``dp = N / pp_size`` pipelines side by side.
Processes are laid out on a mesh ``("dp_replicate", "pp")`` (``"pp"`` innermost, so one pipeline's
stages are neighbouring ranks: rank = dp_index * pp_size + stage_index). Each pipeline reads its own
shard of the data; all stages of one pipeline read the same batch. After a pipeline step, the
gradients of a stage are averaged over the ``dp_replicate`` axis (the same stage of every pipeline)
with one all-reduce of a flat buffer, unless the step is inside ``no_sync`` (gradient accumulation).

Why a manual all-reduce rather than DDP around the stage: torch's pipeline stage drives DDP's reducer
itself on the last micro-batch (``prepare_for_backward``), which would reduce on every call, also in
the middle of gradient accumulation; an explicit reduce after the schedule's backward composes with
any schedule and is skipped exactly when the Accelerator says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from accelerando.parallelism_config import ParallelismConfig

__all__ = [
    "DP_AXIS",
    "PP_AXIS",
    "all_reduce_gradients",
    "build_pipeline_mesh",
    "pipeline_data_parallel_sizes",
]

#: Mesh axis of the data-parallel pipelines (ParallelismConfig's name for plain replicas).
DP_AXIS = "dp_replicate"
#: Mesh axis of the pipeline stages.
PP_AXIS = "pp"
# The flattened data-parallel dimension ParallelismConfig meshes carry (``accelerator.data_parallel_rank``).
_DP_FLAT = "dp"


def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n + 1) if n % d == 0]


def pipeline_data_parallel_sizes(
    pp_size: int | None, num_processes: int, parallelism_config: ParallelismConfig | None = None
) -> tuple[int, int]:
    """Check the pipeline layout and return ``(pp, dp)`` with ``pp * dp == num_processes``.

    Args:
        pp_size: ``PipelineParallelPlugin.pp_size`` (None = every process is a stage: ``dp = 1``).
        num_processes: processes of the job.
        parallelism_config: the Accelerator's ``ParallelismConfig``, or None. It has no pipeline
            axis; only its ``dp_replicate_size`` may be above 1, and must then equal
            ``num_processes / pp_size`` (with ``pp_size`` None, ``pp = num_processes / dp_replicate_size``).

    Returns:
        ``(pp, dp)``: stages per pipeline and data-parallel pipelines.

    Raises:
        RuntimeError: fewer than two processes.
        ValueError: ``pp_size`` larger than the job or not dividing it, or a ParallelismConfig asking
            for tensor / context / sequence parallelism, FSDP sharding, another replica count or an
            ``"auto"`` size (the message names the numbers and the fix).
    """
    if num_processes < 2:
        raise RuntimeError(
            "PipelineParallelPlugin needs at least 2 processes (one per stage); launch with "
            "`accelerando launch --num_processes 2 script.py` or drop the plugin"
        )
    replicate = _replicas(parallelism_config)
    if pp_size is not None:
        pp = int(pp_size)
    elif replicate > 1 and num_processes % replicate == 0:
        pp = num_processes // replicate  # ParallelismConfig(dp_replicate_size=d): the rest are stages
    else:
        pp = num_processes
    if pp > num_processes or num_processes % pp:
        fits = ", ".join(str(d) for d in _divisors(num_processes))
        raise ValueError(
            f"PipelineParallelPlugin(pp_size={pp}) with {num_processes} processes: pipeline x data parallel needs "
            f"num_processes = pp_size x dp (dp data-parallel pipelines), and {pp} does not divide {num_processes}; "
            f"use a pp_size in {{{fits}}} or launch a multiple of {pp} processes (e.g. {-(-num_processes // pp) * pp})"
        )
    dp = num_processes // pp
    if parallelism_config is not None:
        _check_parallelism_config(parallelism_config, pp, dp, num_processes)
    return pp, dp


def _replicas(config: ParallelismConfig | None) -> int:
    """``config.dp_replicate_size`` (1 without a config).

    Raises:
        ValueError: an ``"auto"`` size (the automatic layout does not choose pipeline jobs).
    """
    if config is None:
        return 1
    axes = ("dp_replicate", "dp_shard", "tp", "cp", "sp")
    auto = [
        f"{axis}_size={getattr(config, f'{axis}_size')!r}"
        for axis in axes
        if not isinstance(getattr(config, f"{axis}_size", 1) or 1, int)
    ]
    if auto:
        raise ValueError(
            f"ParallelismConfig({', '.join(auto)}) beside a PipelineParallelPlugin: the automatic layout does not "
            "choose pipeline jobs; give numbers (e.g. dp_replicate_size=num_processes / pp_size) or drop the "
            "ParallelismConfig"
        )
    return int(getattr(config, "dp_replicate_size", 1) or 1)


def _check_parallelism_config(config: ParallelismConfig, pp: int, dp: int, num_processes: int) -> None:
    others = {axis: int(getattr(config, f"{axis}_size", 1) or 1) for axis in ("dp_shard", "tp", "cp", "sp")}
    if any(size > 1 for size in others.values()):
        sizes = ", ".join(f"{axis}_size={size}" for axis, size in others.items() if size > 1)
        raise ValueError(
            f"PipelineParallelPlugin with ParallelismConfig({sizes}): pipeline parallelism combines only with "
            "data-parallel replicas (dp_replicate) here; drop those ParallelismConfig sizes or the plugin"
        )
    replicate = int(getattr(config, "dp_replicate_size", 1) or 1)
    if replicate not in (1, dp):
        raise ValueError(
            f"PipelineParallelPlugin(pp_size={pp}) with ParallelismConfig(dp_replicate_size={replicate}) needs "
            f"{pp} x {replicate} = {pp * replicate} processes but the job has {num_processes}; the data-parallel "
            f"degree of a pipeline job is num_processes / pp_size = {dp}: drop the ParallelismConfig or set "
            f"dp_replicate_size={dp}"
        )


def build_pipeline_mesh(device_type: str, pp: int, dp: int) -> DeviceMesh:
    """The job's mesh: ``("pp",)`` for one pipeline, ``("dp_replicate", "pp")`` (and a flattened ``"dp"``) for several.

    Collective: every process of the job calls it (it creates the axes' process groups).

    Args:
        device_type: the processes' device type (``"cpu"``, ``"cuda"``, ...).
        pp: stages per pipeline.
        dp: data-parallel pipelines.
    """
    from torch.distributed.device_mesh import init_device_mesh

    if dp == 1:
        return init_device_mesh(device_type, (pp,), mesh_dim_names=(PP_AXIS,))
    mesh = init_device_mesh(device_type, (dp, pp), mesh_dim_names=(DP_AXIS, PP_AXIS))
    # ``accelerator.data_parallel_rank`` reads the flattened "dp" dimension, as on ParallelismConfig meshes.
    # torch 2.13: torch/distributed/device_mesh.py:1268 (private; no public way to name a flattened axis)
    mesh[(DP_AXIS,)]._flatten(_DP_FLAT)
    return mesh


def all_reduce_gradients(
    parameters: Iterable[torch.Tensor], group: dist.ProcessGroup | None, size: int
) -> None:
    """Average the gradients of ``parameters`` over ``group`` (``size`` processes) with one all-reduce.

    Parameters without a gradient are skipped; every process of the group must pass the same
    parameters with the same gradients present (the same stage of every pipeline does).
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if size <= 1 or not grads:
        return
    # torch 2.13: torch/_utils.py:588, :625 (private; one flat buffer for one all-reduce, as DDP's buckets)
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    by_dtype: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for grad in grads:
        by_dtype.setdefault((grad.dtype, grad.device), []).append(grad)
    for bucket in by_dtype.values():
        flat = _flatten_dense_tensors(bucket)
        dist.all_reduce(flat, group=group)
        flat.div_(size)
        for grad, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
            grad.copy_(reduced)
