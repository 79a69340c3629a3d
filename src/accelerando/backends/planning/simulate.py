"""Run one candidate's training steps and count its memory and collectives.

:func:`run_steps` runs on whatever process group is active: the fake one of :func:`simulate` (fake
tensors, any world size, one CPU process) or a real gloo group (the validation's measured runs). Both
take the same path: build the model, lay it out (:func:`~accelerando.backends.planning.layouts.apply_layout`),
build the optimizer, then two steps of forward, backward, optimizer step and ``zero_grad`` under the
memory tracker; collectives are counted during the second (steady-state) step only. A measured DDP run
takes one step more and counts the third: DDP's reducer rebuilds its buckets in its second iteration
and broadcasts their order from rank 0 then (``(parameters + 1 + buckets) x 4`` bytes, once per job),
so its steady state starts at the third.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist

# torch 2.13: torch/utils/_python_dispatch.py:72 (private; base of the op-counting dispatch mode)
from torch.utils._python_dispatch import TorchDispatchMode

from accelerando.backends.planning.derive import ZERO3_DEFAULTS
from accelerando.backends.planning.layouts import apply_layout, build_mesh, one_rank_chunks
from accelerando.backends.planning.models import ModelSource
from accelerando.backends.planning.spec import Candidate, MemoryBreakdown, TrainingShape
from accelerando.backends.planning.tracking import CollectiveCounter, memory_tracker, tracked_breakdown

if TYPE_CHECKING:
    # torch 2.13: torch/_ops.py:806, torch/distributed/_tools/mem_tracker.py:324 (private; annotations only)
    from torch._ops import OpOverload
    from torch.distributed._tools.mem_tracker import MemTracker

__all__ = ["StepCount", "ddp_bucket_bytes", "run_steps", "simulate", "zero3_sizes"]

_STEPS = 2


@dataclass(frozen=True)
class StepCount:
    """What one rank held and sent.

    Attributes:
        memory: the peak, by category.
        collective_bytes: bytes per collective kind in the steady-state step.
        trainable_bytes: bytes of the trainable parameters the rank holds (DDP's buckets hold as many).
        num_parameters: parameters of the whole model (before any split).
        zero3_sizes: :func:`zero3_sizes` of the model at the candidate's data-parallel degree (what the
            DeepSpeed ZeRO-3 formula of :mod:`.derive` needs); empty when not counted.
    """

    memory: MemoryBreakdown
    collective_bytes: dict[str, int]
    trainable_bytes: int
    num_parameters: int
    zero3_sizes: dict[str, int] = field(default_factory=dict)


def zero3_sizes(
    model: torch.nn.Module, ranks: int, persistence_threshold: int | None = None
) -> dict[str, int]:
    """Element counts of ``model`` as DeepSpeed ZeRO-3 partitions it over ``ranks`` ranks.

    DeepSpeed pads each parameter to a multiple of the ranks and gives every rank ``ceil(numel / ranks)``
    elements of it; a parameter of at most ``persistence_threshold`` elements
    (``stage3_param_persistence_threshold``, default :data:`~.derive.ZERO3_DEFAULTS`'s) is also kept whole on
    every rank ("persistent": never gathered in forward or backward, all-gathered once after each optimizer
    step).

    Returns:
        ``elements`` (all trainable parameters), ``partition`` (the elements one rank owns),
        ``persistent`` (elements of the persistent parameters), ``persistent_aligned`` and
        ``gathered_aligned`` (the padded elements of the persistent and of the other parameters), and
        ``buffer_bytes`` (the model's buffers, which DeepSpeed leaves on every rank), and ``ranks``.
    """
    threshold = (
        ZERO3_DEFAULTS.param_persistence_threshold if persistence_threshold is None else persistence_threshold
    )
    sizes: dict[str, int] = dict.fromkeys(
        ("elements", "partition", "persistent", "persistent_aligned", "gathered_aligned"), 0
    )
    for param in model.parameters():
        if not param.requires_grad:
            continue
        numel = param.numel()
        share = -(-numel // ranks)
        sizes["elements"] += numel
        sizes["partition"] += share
        if numel <= threshold:
            sizes["persistent"] += numel
            sizes["persistent_aligned"] += share * ranks
        else:
            sizes["gathered_aligned"] += share * ranks
    sizes["buffer_bytes"] = sum(b.numel() * b.element_size() for b in model.buffers())
    sizes["ranks"] = ranks
    return sizes


def ddp_bucket_bytes(model: torch.nn.Module) -> int:
    """Bytes of DDP's gradient buckets: one slot per trainable parameter element, in its dtype."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def _loss(output: object) -> torch.Tensor:
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    # A model output without a loss: a tensor, or a tuple-like output (transformers' ModelOutput) led by one.
    tensor = output if isinstance(output, torch.Tensor) else cast("Sequence[torch.Tensor]", output)[0]
    return tensor.float().mean()


def _step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    shape: TrainingShape,
) -> None:
    autocast = (
        torch.autocast("cpu", dtype=torch.bfloat16)
        if shape.mixed_precision == "bf16"
        else contextlib.nullcontext()
    )
    with autocast:
        loss = _loss(model(**batch))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _optimizer(model: torch.nn.Module, shape: TrainingShape) -> torch.optim.Optimizer:
    # foreach=True: the multi-tensor kernels CUDA uses by default (their temporaries count).
    params = [p for p in model.parameters() if p.requires_grad]
    if shape.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-3, foreach=True)
    return torch.optim.AdamW(params, lr=1e-3, foreach=True)


def run_steps(source: ModelSource, candidate: Candidate, shape: TrainingShape, fake: bool) -> StepCount:
    """Build, lay out and train ``source``'s model for two steps (a measured DDP run: three) on the active group.

    Args:
        source: the model and its batches.
        candidate: the layout (its world size must be the process group's).
        shape: micro-batch, sequence, precision, optimizer, activation checkpointing.
        fake: run under a ``FakeTensorMode`` (no tensor memory is allocated; with the fake process group
            no data moves). With ``fake`` False on a real group this is a measured run.

    Returns:
        The rank's :class:`StepCount`. For a stage-0 candidate under ``fake`` the model is stepped
        unwrapped and DDP's buckets (gradients) and bucket all-reduce are added by formula.

    Raises:
        ValueError: the process group's world size is not the candidate's.
    """
    world = dist.get_world_size()
    if world != candidate.world_size:
        raise ValueError(
            f"candidate {candidate.name} needs {candidate.world_size} processes, the group has {world}"
        )
    sharded_or_split = candidate.zero_stage >= 2 or candidate.tp > 1
    mesh = build_mesh(candidate) if sharded_or_split else None
    counter = CollectiveCounter()
    mode: contextlib.AbstractContextManager[object]
    chunks: contextlib.AbstractContextManager[None]
    if fake:
        # torch 2.13: torch/_subclasses/fake_tensor.py:1432 (private; runs the step on tensors without memory)
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode, chunks = FakeTensorMode(allow_non_fake_inputs=True), one_rank_chunks()
    else:
        mode, chunks = contextlib.nullcontext(), contextlib.nullcontext()
    with mode, chunks:
        torch.manual_seed(0)
        model = source.build()
        model.train()
        num_parameters = sum(p.numel() for p in model.parameters())
        buckets = ddp_bucket_bytes(model) if not sharded_or_split else 0
        buffers = sum(b.numel() * b.element_size() for b in model.buffers())
        sizes = zero3_sizes(model, candidate.data_parallel)
        model = apply_layout(model, candidate, shape, mesh, wrap_ddp=False)
        optimizer = _optimizer(model, shape)
        steps = _STEPS + 1 if not sharded_or_split and not fake else _STEPS
        batches = [source.batch(shape.micro_batch, shape.seq_length) for _ in range(steps)]
    # The steps run with the fake mode off the stack: fake tensors still compute as fake tensors (each
    # carries its mode), and the tracker then sees every op, including the local ops of DTensors, the
    # way it sees them in a real run (with the mode on the stack below it, DTensor's local ops bypass it).
    tracker = memory_tracker(model, optimizer)
    before_wrap = after_wrap = 0
    with tracker, _FakeCollectiveAliases() if fake else contextlib.nullcontext():
        if not sharded_or_split and not fake:
            before_wrap = _current_total(tracker)
            model = apply_layout(model, replace(candidate, zero_stage=0), shape, None, wrap_ddp=True)
            after_wrap = _current_total(tracker)
        for step, batch in enumerate(batches):
            with counter if step == steps - 1 else contextlib.nullcontext():
                _step(model, optimizer, batch, shape)
            if hasattr(tracker, "reset_mod_stats"):
                tracker.reset_mod_stats()
    trainable = sum(_local_bytes(p) for p in model.parameters() if p.requires_grad)
    collectives = dict(counter.bytes_by_kind)
    memory = tracked_breakdown(tracker)
    if not sharded_or_split:
        if fake:
            # DDP's reducer cannot run on the fake process group: its buckets (one gradient copy) and
            # its per-step traffic (the buckets all-reduced, the buffers broadcast before each forward).
            memory = replace(memory, gradients=memory.gradients + buckets)
            collectives["all_reduce (dp)"] = buckets
            if buffers:
                collectives["broadcast (dp)"] = buffers
        else:
            # DDP's buckets were created outside forward/backward, which the tracker files as activations.
            moved = min(after_wrap - before_wrap, memory.activations)
            memory = replace(
                memory, activations=memory.activations - moved, gradients=memory.gradients + moved
            )
    return StepCount(memory, collectives, trainable, num_parameters, sizes)


class _FakeCollectiveAliases(TorchDispatchMode):
    """Give the fake functional collectives' autograd wrapper the aliasing the real one has.

    DTensor wraps the output of each functional collective (``all_gather_into_tensor``, ``all_reduce``,
    ...) in ``_c10d_functional._wrap_tensor_autograd``. The real op returns its input's storage; its
    fake-tensor implementation allocates a new tensor of the same size. Under a tensor-parallel layout
    that counted every gathered activation twice while it lived: at the all-gather of the logits (the
    ``ColwiseParallel`` LM head's shards gathered into a replicated tensor, ``2 x 64 x 512`` fp32 for the
    tiny Llama) the simulated total was 256 KiB above the real one, and the simulated peak 128 KiB
    above the measured one (the validation's FSDP2 x TP rows). Under this mode (only in simulations)
    the op returns its input, as ``MemTracker`` does for ``wait_tensor``.
    """

    def __torch_dispatch__(
        self,
        func: OpOverload,
        types: Sequence[type],
        args: tuple[object, ...] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        """``args[0]`` for ``_wrap_tensor_autograd``; every other op runs as it is."""
        if func.namespace == "_c10d_functional" and func.__name__.startswith("_wrap_tensor_autograd"):
            return args[0]
        return func(*args, **(kwargs or {}))


def _current_total(tracker: MemTracker) -> int:
    return sum(int(snap.get("Total", 0)) for snap in tracker.get_tracker_snapshot("current").values())


def _local_bytes(param: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor

    local = param.to_local() if isinstance(param, DTensor) else param
    return local.numel() * local.element_size()


def simulate(source: ModelSource, candidate: Candidate, shape: TrainingShape) -> StepCount:
    """Simulate rank 0 of ``candidate`` at its full world size: fake tensors on a fake process group.

    Raises:
        ValueError: a process group is already initialised in this process (plan before the job starts,
            or in a separate process), or the candidate cannot be laid out.
    """
    # torch 2.13: torch/testing/_internal/distributed/fake_pg.py:7 (private; the store of the 'fake' backend)
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ValueError(
            "the planner simulates on a fake process group and this process already has a real one; run "
            "`accelerando plan` (or the planner) in a separate process, before the job starts"
        )
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=candidate.world_size)
    try:
        return run_steps(source, candidate, shape, fake=True)
    finally:
        dist.destroy_process_group()
