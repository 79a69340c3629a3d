"""Lay a model out for one candidate, by the steps our strategies take.

The order is :class:`~accelerando.backends.strategies.composable.ComposableStrategy`'s ``prepare_model``: tensor
parallelism on the ``tp`` axis first (the model's transformers ``tp_plan`` turned into torch styles by
the strategy's own :mod:`~accelerando.backends.strategies.composable.plan` functions, ties re-pointed by
:mod:`~accelerando.backends.strategies.ties`), then activation checkpointing of the model's no-split layers
(:func:`~accelerando.backends.strategies.fsdp.wrap.apply_activation_checkpointing`), then FSDP2 ``fully_shard``
of each layer and the root on the data axes. DDP is torch's ``DistributedDataParallel``, as
:class:`~accelerando.backends.strategies.ddp.DDPStrategy` wraps it (real process groups only: DDP's reducer
cannot run on the fake process group, so the simulator steps the plain model and adds DDP's gradient
buckets and all-reduce by formula).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, overload

import torch

import accelerando.backends.strategies.ties as ties
from accelerando.backends.planning.spec import Candidate, TrainingShape
from accelerando.backends.strategies.composable.checks import check_heads
from accelerando.backends.strategies.composable.plan import module_plan, resolve_plan, to_parallel_style
from accelerando.backends.strategies.fsdp.wrap import apply_activation_checkpointing

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["apply_layout", "build_mesh", "layer_units", "one_rank_chunks", "tp_plan_available"]


def build_mesh(candidate: Candidate) -> DeviceMesh:
    """The CPU device mesh of ``candidate`` on the current process group.

    Its dimensions are ``dp_replicate`` (when above 1), ``dp_shard`` (always: FSDP2 shards on it) and
    ``tp`` (when above 1), in that order. A dimension of size 1 is left out: it would cost one process
    group per rank (4,096 groups at 4,096 ranks) and changes nothing of the layout.

    Built outside any fake-tensor mode (the mesh reads its rank layout as real numbers).
    """
    from torch.distributed.device_mesh import init_device_mesh

    dims = [("dp_replicate", candidate.dp_replicate), ("dp_shard", candidate.dp_shard), ("tp", candidate.tp)]
    kept = [(name, size) for name, size in dims if size > 1 or name == "dp_shard"]
    return init_device_mesh(
        "cpu", tuple(size for _, size in kept), mesh_dim_names=tuple(name for name, _ in kept)
    )


class _LazyChunks(Sequence[torch.Tensor]):
    """``torch.chunk(tensor, num_chunks, dim)`` padded with empty tensors to ``num_chunks``, made on demand.

    Each item is the view (or the empty tensor) FSDP2's ``_chunk_with_empty`` would have put there.
    """

    def __init__(self, tensor: torch.Tensor, num_chunks: int, dim: int) -> None:
        self._tensor, self._num_chunks, self._dim = tensor, num_chunks, dim
        size = tensor.size(dim)
        self._chunk_size = math.ceil(size / num_chunks)
        self._nonempty = math.ceil(size / self._chunk_size)
        self._made: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self._num_chunks

    @overload
    def __getitem__(self, index: int) -> torch.Tensor: ...

    @overload
    def __getitem__(self, index: slice) -> list[torch.Tensor]: ...

    def __getitem__(self, index: int | slice) -> torch.Tensor | list[torch.Tensor]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._num_chunks))]
        if index < 0:
            index += self._num_chunks
        if not 0 <= index < self._num_chunks:
            raise IndexError(f"chunk {index} of {self._num_chunks}")
        if index not in self._made:
            if index < self._nonempty:
                start = index * self._chunk_size
                length = min(self._chunk_size, self._tensor.size(self._dim) - start)
                self._made[index] = self._tensor.narrow(self._dim, start, length)
            else:
                self._made[index] = self[0].new_empty(0)
        return self._made[index]


@contextlib.contextmanager
def one_rank_chunks() -> Iterator[None]:
    """Let FSDP2 cut each parameter into the one shard the simulated rank holds, not one per rank.

    ``fully_shard`` splits every parameter into world-size chunks (``_chunk_with_empty``: the views of
    ``torch.chunk`` plus one new empty tensor per rank past the last non-empty chunk) and keeps only its
    own rank's and the first; under a fake-tensor mode each chunk is a fake-tensor operation, so laying
    out a model cost time proportional to the world size (10,000 operations at 512 ranks). Inside this
    context the chunks are made when FSDP2 reads them: the same views and empty tensors, two per
    parameter. Only the simulator uses it; a measured run lays out with torch's own function.
    """
    # torch 2.13: torch/distributed/fsdp/_fully_shard/_fsdp_param.py:1 (private; FSDP2's chunking is patched here)
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    # torch 2.13: torch/distributed/fsdp/_fully_shard/_fsdp_common.py:134 (private; made lazy under fake tensors)
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty as original

    def chunk_with_empty(tensor: torch.Tensor, num_chunks: int, dim: int) -> Sequence[torch.Tensor]:
        if tensor.size(dim) == 0:
            return original(tensor, num_chunks, dim)
        return _LazyChunks(tensor, num_chunks, dim)

    setattr(_fsdp_param, "_chunk_with_empty", chunk_with_empty)  # noqa: B010 (a module attribute of torch)
    try:
        yield
    finally:
        setattr(_fsdp_param, "_chunk_with_empty", original)  # noqa: B010


def layer_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated layers (its ``_no_split_modules``), less those holding part of a tied weight."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    units = [m for m in model.modules() if m is not model and type(m).__name__ in names]
    kept, _dropped = ties.units_keeping_ties(model, units)
    return kept


def tp_plan_available(model: torch.nn.Module) -> bool:
    """True when the model declares a tensor-parallel plan (transformers ``tp_plan``)."""
    return bool(module_plan(model))


def _apply_tensor_parallel(model: torch.nn.Module, tp_mesh: DeviceMesh) -> None:
    from torch.distributed.tensor.parallel import parallelize_module

    check_heads(model, tp_mesh.size())
    resolved = resolve_plan(model, module_plan(model))
    styles = {}
    for name, style in resolved.items():
        parallel = to_parallel_style(style, model.get_submodule(name), name)
        if parallel is not None:
            styles[name] = parallel
    tied = ties.find_ties(model)
    parallelize_module(model, tp_mesh, styles, src_data_rank=None)
    ties.retie(model, ties.check_ties(model, tied, resolved))


@contextlib.contextmanager
def _real_mesh_arithmetic() -> Iterator[None]:
    """Let FSDP2 combine the data and ``tp`` meshes outside the fake-tensor mode, and nothing else.

    ``DeviceMesh._concatenate`` (called by ``fully_shard`` for parameters that are already tensor-parallel
    DTensors) computes mesh coordinates with tensor ops that a fake tensor cannot answer. Only that call
    leaves the mode: a tensor FSDP2 allocated outside it would be real, then copied into a fake twin by
    the next fake op, and counted twice.
    """
    # torch 2.13: torch/_subclasses/fake_tensor.py:208 (private; leave the fake mode to build a real mesh)
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    # torch 2.13: torch/distributed/device_mesh.py:1429 (private; FSDP2 concatenates meshes here)
    original = DeviceMesh._concatenate

    def concatenate(meshes: list[DeviceMesh]) -> DeviceMesh:
        with unset_fake_temporarily():
            return original(meshes)

    # torch 2.13: torch/distributed/device_mesh.py:1429 (private; patched for the block)
    DeviceMesh._concatenate = staticmethod(concatenate)  # type: ignore[method-assign]
    try:
        yield
    finally:
        # torch 2.13: torch/distributed/device_mesh.py:1429 (private; torch's own put back)
        DeviceMesh._concatenate = staticmethod(original)  # type: ignore[method-assign]


def apply_layout(
    model: torch.nn.Module,
    candidate: Candidate,
    shape: TrainingShape,
    mesh: DeviceMesh | None,
    wrap_ddp: bool,
) -> torch.nn.Module:
    """Lay ``model`` out as ``candidate`` says and return the model to train.

    Args:
        model: the freshly built model (fake or real tensors).
        candidate: ``zero_stage`` 2 / 3 shard with FSDP2 (``reshard_after_forward`` False / True);
            ``tp > 1`` splits first; stage 0 is data parallel (DDP).
        shape: activation checkpointing and mixed precision come from here.
        mesh: :func:`build_mesh`'s mesh (None for DDP).
        wrap_ddp: wrap a stage-0 model in ``DistributedDataParallel`` (real process groups only).

    Raises:
        ValueError: ``tp > 1`` on a model without a tensor-parallel plan, or a degree its heads refuse;
            a sharded or split candidate without a mesh.
    """
    if candidate.tp > 1:
        if not tp_plan_available(model):
            raise ValueError(
                f"{type(model).__name__} declares no tensor-parallel plan (tp_plan); drop the fsdp2_tp layouts"
            )
        if mesh is None:
            raise ValueError(f"{candidate.name} splits tensors and needs build_mesh's mesh")
        _apply_tensor_parallel(model, mesh["tp"])
    units = layer_units(model)
    if shape.activation_checkpointing:
        units = apply_activation_checkpointing(model, units)
    if candidate.zero_stage >= 2:
        if mesh is None:
            raise ValueError(f"{candidate.name} shards and needs build_mesh's mesh")
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        dims = ("dp_replicate", "dp_shard") if candidate.dp_replicate > 1 else ("dp_shard",)
        data_mesh = mesh[dims] if len(dims) > 1 else mesh[dims[0]]
        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if shape.mixed_precision == "bf16"
            else MixedPrecisionPolicy()
        )
        options = {"mesh": data_mesh, "reshard_after_forward": candidate.zero_stage == 3, "mp_policy": policy}
        with _real_mesh_arithmetic():
            for unit in units:
                fully_shard(unit, **options)
            fully_shard(model, **options)
        return model
    if wrap_ddp:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    return model
