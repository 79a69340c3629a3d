"""PipelineModel: the object a pipeline-parallel ``prepare`` returns in place of the user's model.

Calling it runs a whole pipeline step: in training (``model.train()``, a ``target``) the schedule
runs every micro-batch's forward AND backward at once, so gradients are ready when the call
returns and ``accelerator.backward(output.loss)`` only checks that. The loss, computed on the last
stage, is averaged over the micro-batches and broadcast to every stage for logging.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from accelerando.backends.strategies.pipeline.data_parallel import all_reduce_gradients
from accelerando.backends.strategies.pipeline.stage import (
    PipelineLayout,
    build_schedule,
    build_traced_stage,
    microbatch,
)

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    # torch 2.13: torch/distributed/pipelining/stage.py:129 (private; annotations only)
    from torch.distributed.pipelining.stage import _PipelineStageBase

__all__ = ["PipelineModel", "PipelineOutput"]


@dataclass
class PipelineOutput:
    """What one pipeline call returns.

    Attributes:
        loss: mean loss over the micro-batches, on every process (no graph: backward already ran in
            training); None without a target.
        output: the model's output on the last stage (None on the other stages in training; in
            evaluation every stage receives it).
    """

    loss: torch.Tensor | None
    output: object

    def __getitem__(self, key: str | int) -> object:
        return getattr(self, key) if isinstance(key, str) else (self.loss, self.output)[key]


def _shape_key(value: object) -> Hashable:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_shape_key(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _shape_key(v)) for k, v in sorted(value.items()))
    return type(value).__name__


class PipelineModel(torch.nn.Module):
    """The user's model run as one stage of a pipeline (every process holds the whole model).

    Args:
        module: the user's model; its parameters are the stages' parameters.
        layout: which stage this process runs.
        split_points: module names where stages 1..n-1 begin.
        schedule: ``"GPipe"`` or ``"1F1B"``.
        num_microbatches: micro-batches per call (the batch is cut along dim 0).
        loss_fn: ``loss_fn(output, target)``; needed in training.
        loss_divisor: called at each training step; the loss is divided by it before backward
            (gradient accumulation steps).
        device: where the stage runs.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        layout: PipelineLayout,
        split_points: Sequence[str],
        schedule: str,
        num_microbatches: int,
        loss_fn: Callable[..., torch.Tensor] | None,
        loss_divisor: Callable[[], int],
        device: torch.device,
    ) -> None:
        super().__init__()
        self.module = module
        self.layout = layout
        self.split_points = list(split_points)
        self.schedule_name = schedule
        self.num_microbatches = num_microbatches
        self.loss_fn = loss_fn
        self._loss_divisor = loss_divisor
        self.device = device
        self._built: dict[Hashable, tuple[_PipelineStageBase, PipelineScheduleSingle]] = {}
        #: training steps whose backward already ran and that ``accelerator.backward`` has not seen yet.
        self.pending_backward = 0
        #: whether a training call averages the stage's gradients over the data-parallel pipelines
        #: (False inside ``no_sync``: gradient accumulation keeps them local until the sync step).
        self.require_grad_sync = True

    # A stage module per micro-batch shape: the traced stage is specialised to its example shapes.
    def _stage(
        self, args: tuple[object, ...], kwargs: dict[str, object], training: bool
    ) -> tuple[_PipelineStageBase, PipelineScheduleSingle]:
        mb_args = microbatch(args, self.num_microbatches)
        mb_kwargs = microbatch(kwargs, self.num_microbatches)
        assert isinstance(mb_args, tuple) and isinstance(mb_kwargs, dict), "microbatch keeps containers"

        key = (_shape_key(mb_args), _shape_key(mb_kwargs), training)
        if key not in self._built:
            stage = build_traced_stage(
                self.module, self.split_points, mb_args, mb_kwargs, self.layout, self.device
            )
            loss_fn = self._scaled_loss if training else None
            self._built[key] = (
                stage,
                build_schedule(stage, self.schedule_name, self.num_microbatches, loss_fn),
            )
        return self._built[key]

    def _scaled_loss(self, output: object, target: object) -> torch.Tensor:
        assert self.loss_fn is not None
        # Divided here rather than by the schedule's ``scale_grads``, which rescales every gradient of
        # the stage, including those accumulated by earlier calls (gradient accumulation).
        return self.loss_fn(output, target) / (self.num_microbatches * max(int(self._loss_divisor()), 1))

    def stage_module(self) -> torch.nn.Module | None:
        """This process's stage submodule (None before the first call)."""
        for stage, _ in self._built.values():
            return stage.submod
        return None

    def _check_batch(self, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        first = next((v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)), None)
        if first is None:
            raise ValueError(
                "a pipeline call needs at least one tensor input (micro-batches are cut from it)"
            )
        if first.shape[0] % self.num_microbatches:
            raise ValueError(
                f"batch size {first.shape[0]} is not divisible by num_microbatches={self.num_microbatches}; "
                "use a batch size that is a multiple of it (e.g. drop_last=True in the DataLoader) or change "
                "num_microbatches"
            )

    def forward(self, *args: object, target: object = None, **kwargs: object) -> PipelineOutput:
        """Run the pipeline on one batch.

        In training mode with a ``target``: forward and backward of every micro-batch; returns the
        mean loss (broadcast); with several data-parallel pipelines, the stage's gradients are then
        averaged over them (unless inside ``no_sync``). The loss is this pipeline's. Otherwise: forward only; the last stage's output is sent to every
        stage, and the loss is computed when a ``target`` and ``loss_fn`` are given.

        Raises:
            ValueError: training without ``loss_fn``, or a batch not divisible into micro-batches.
        """
        self._check_batch(args, kwargs)
        training = self.training and torch.is_grad_enabled() and target is not None
        if training and self.loss_fn is None:
            raise ValueError(
                "pipeline training computes the loss on the last stage: give "
                "PipelineParallelPlugin(loss_fn=...) (loss_fn(output, target) -> scalar)"
            )
        args = tuple(a.to(self.device) if isinstance(a, torch.Tensor) else a for a in args)
        kwargs = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        stage, schedule = self._stage(args, kwargs, training)
        layout = self.layout
        first_inputs = (args, kwargs) if layout.is_first else ((), {})
        # The user's keyword inputs go to the first stage's forward as they are.
        step: Callable[..., object] = schedule.step
        if training:
            losses: list[torch.Tensor] = []
            target = target.to(self.device) if isinstance(target, torch.Tensor) else target
            output = step(
                *first_inputs[0], target=target if layout.is_last else None, losses=losses, **first_inputs[1]
            )
            divisor = self.num_microbatches * max(int(self._loss_divisor()), 1)
            loss = (
                torch.stack([x.detach().float() for x in losses]).sum() * (divisor / self.num_microbatches)
                if layout.is_last
                else torch.zeros((), device=self.device)
            )
            dist.broadcast(loss, src=layout.last_rank, group=layout.group)
            if self.require_grad_sync and layout.dp_size > 1:
                all_reduce_gradients(stage.submod.parameters(), layout.dp_group, layout.dp_size)
            self.pending_backward += 1
            return PipelineOutput(loss=loss, output=output if layout.is_last else None)
        with torch.no_grad():
            output = step(*first_inputs[0], **first_inputs[1])
        holder = [output if layout.is_last else None]
        dist.broadcast_object_list(holder, src=layout.last_rank, group=layout.group)
        output = holder[0]
        loss = None
        if target is not None and self.loss_fn is not None:
            loss = self.loss_fn(
                output, target.to(self.device) if isinstance(target, torch.Tensor) else target
            )
        return PipelineOutput(loss=loss, output=output)
