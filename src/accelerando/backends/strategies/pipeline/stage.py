"""One process's pipeline stage: trace the model, cut it, build the stage and its schedule.

The model is traced with ``torch.distributed.pipelining.pipeline`` (torch.export) on micro-batch
shaped example inputs, cut at the beginning of each split-point module, and this process keeps the
submodule of its stage. Stage submodules share their parameters with the user's model (the same
``Parameter`` objects), so an optimizer built on the model updates them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    # torch 2.13: torch/distributed/pipelining/stage.py:129 (private; annotations only)
    from torch.distributed.pipelining.stage import _PipelineStageBase

__all__ = [
    "SCHEDULES",
    "PipelineLayout",
    "build_schedule",
    "build_traced_stage",
    "microbatch",
    "no_kv_cache",
]

#: The schedule names accepted by the plugin and ``prepare_pippy`` -> torch class name.
SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


@dataclass(frozen=True)
class PipelineLayout:
    """Which stage this process runs and who its neighbours are.

    Attributes:
        stage_index: this process's stage (0 = the first).
        num_stages: stages in the pipeline.
        group: the process group of the pipeline (None = the default group).
        ranks: global ranks of the pipeline, in stage order.
        dp_group: the process group of this stage in every data-parallel pipeline (None = one pipeline).
        dp_size: data-parallel pipelines (1 = pipeline parallelism alone).
        dp_rank: which of them this process belongs to.
    """

    stage_index: int
    num_stages: int
    group: dist.ProcessGroup | None
    ranks: tuple[int, ...]
    dp_group: dist.ProcessGroup | None = None
    dp_size: int = 1
    dp_rank: int = 0

    @property
    def is_first(self) -> bool:
        """Whether this process runs the first stage (it feeds the inputs)."""
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        """Whether this process runs the last stage (it holds outputs and losses)."""
        return self.stage_index == self.num_stages - 1

    @property
    def last_rank(self) -> int:
        """Global rank of the last stage."""
        return self.ranks[-1]

    @classmethod
    def whole_world(cls) -> PipelineLayout:
        """Every process of the default group is one stage, in rank order.

        Raises:
            RuntimeError: no process group (pipelines need several processes).
        """
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "pipeline parallelism needs a process group of several processes; launch with "
                "`accelerando launch --num_processes N` or torchrun"
            )
        world = dist.get_world_size()
        return cls(dist.get_rank(), world, None, tuple(range(world)))

    @classmethod
    def from_mesh(cls, mesh: DeviceMesh) -> PipelineLayout:
        """This process's place on a mesh with a ``"pp"`` axis and, optionally, a ``"dp_replicate"`` axis.

        Raises:
            ValueError: the mesh has no ``"pp"`` axis.
        """
        names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
        if "pp" not in names:
            raise ValueError(f"a pipeline needs a mesh with a 'pp' axis, got axes {names}")
        pp_mesh = mesh["pp"]
        ranks = tuple(int(r) for r in pp_mesh.mesh.flatten().tolist())
        if "dp_replicate" not in names:
            return cls(int(pp_mesh.get_local_rank()), len(ranks), pp_mesh.get_group(), ranks)
        dp_mesh = mesh["dp_replicate"]
        return cls(
            int(pp_mesh.get_local_rank()),
            len(ranks),
            pp_mesh.get_group(),
            ranks,
            dp_group=dp_mesh.get_group(),
            dp_size=int(dp_mesh.size()),
            dp_rank=int(dp_mesh.get_local_rank()),
        )


@contextlib.contextmanager
def no_kv_cache(model: torch.nn.Module) -> Iterator[None]:
    """Turn off ``config.use_cache`` (transformers) while tracing: cache objects cannot be exported."""
    config = getattr(model, "config", None)
    old = getattr(config, "use_cache", None)
    if config is not None and old:
        config.use_cache = False
    try:
        yield
    finally:
        if config is not None and old:
            config.use_cache = old


@contextlib.contextmanager
def _restored_forwards(model: torch.nn.Module, names: Sequence[str]) -> Iterator[None]:
    """Undo the split markers torch's tracer patches onto the split modules' ``forward``.

    Left in place they would wrap themselves on the next trace (a new micro-batch shape) and recurse.
    """
    modules = [model.get_submodule(name) for name in names]
    saved = [{k: m.__dict__[k] for k in ("forward", "_orig_forward") if k in m.__dict__} for m in modules]
    try:
        yield
    finally:
        for module, own in zip(modules, saved, strict=True):
            for key in ("forward", "_orig_forward"):
                module.__dict__.pop(key, None)
            module.__dict__.update(own)


def microbatch(value: object, num_chunks: int) -> object:
    """The first of ``num_chunks`` micro-batches of ``value`` (tensors are cut along dim 0)."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            return value
        return value.tensor_split(num_chunks, dim=0)[0]
    if isinstance(value, (list, tuple)):
        return type(value)(microbatch(v, num_chunks) for v in value)
    if isinstance(value, Mapping):
        return {k: microbatch(v, num_chunks) for k, v in value.items()}
    return value


def build_traced_stage(
    model: torch.nn.Module,
    split_points: Sequence[str],
    example_args: tuple[object, ...],
    example_kwargs: Mapping[str, object] | None,
    layout: PipelineLayout,
    device: torch.device,
) -> _PipelineStageBase:
    """Trace ``model`` on micro-batch example inputs, cut it and build this process's stage.

    Args:
        model: the whole model (every process holds it; each keeps running only its stage).
        split_points: module names where stages 1..n-1 begin.
        example_args: positional inputs of ONE micro-batch.
        example_kwargs: keyword inputs of one micro-batch.
        layout: this process's place in the pipeline.
        device: where the stage runs.

    Returns:
        A ``torch.distributed.pipelining`` stage for ``layout.stage_index``.

    Raises:
        RuntimeError: the model cannot be captured as one graph (the message says what to change).
    """
    from torch.distributed.pipelining import SplitPoint, pipeline

    spec = {name: SplitPoint.BEGINNING for name in split_points}
    try:
        with no_kv_cache(model), _restored_forwards(model, split_points):
            pipe = pipeline(
                model, mb_args=tuple(example_args), mb_kwargs=dict(example_kwargs or {}), split_spec=spec
            )
    except Exception as exc:
        cause = exc.__cause__ or exc
        raise RuntimeError(
            f"could not trace {type(model).__name__} into pipeline stages ({cause.__class__.__name__}: "
            f"{str(cause).splitlines()[0] if str(cause) else ''}); the model's forward must export as one graph "
            "(no data-dependent Python control flow, no cache objects): pass plain tensors as inputs, or "
            "split a model whose forward is a chain of layers"
        ) from exc
    if pipe.num_stages != layout.num_stages:
        raise ValueError(
            f"the split points {list(split_points)} gave {pipe.num_stages} stages but the pipeline has "
            f"{layout.num_stages} processes; check that every split point is called in forward"
        )
    return pipe.build_stage(layout.stage_index, device, group=layout.group)


def build_schedule(
    stage: _PipelineStageBase,
    schedule: str,
    num_microbatches: int,
    loss_fn: Callable[..., torch.Tensor] | None = None,
) -> PipelineScheduleSingle:
    """A torch pipeline schedule (``"GPipe"`` or ``"1F1B"``) over ``stage``.

    The schedule does not rescale gradients (``scale_grads=False``): the caller's ``loss_fn`` divides
    by the number of micro-batches, so gradients accumulated over several calls stay untouched.

    Raises:
        ValueError: an unknown schedule name.
    """
    import torch.distributed.pipelining as pipelining

    key = str(schedule).lower()
    if key not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; choose one of 'GPipe', '1F1B'")
    cls = getattr(pipelining, SCHEDULES[key])
    return cls(stage, n_microbatches=num_microbatches, loss_fn=loss_fn, scale_grads=False)
