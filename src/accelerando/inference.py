"""Pipeline-parallel inference: ``prepare_pippy`` cuts a model into one stage per process.

The model is traced with ``torch.distributed.pipelining`` on micro-batch shaped example inputs
and cut at the split points (``"auto"``: balanced by parameter bytes, never inside the classes
of ``no_split_module_classes``). Afterwards calling the model feeds the batch in ``num_chunks``
micro-batches through the stages: the first process gives the inputs, the last one gets the
output (every process does with ``gather_output=True``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from accelerando.backends.strategies.pipeline.split import (
    balanced_split_points,
    generate_stage_map,
    validate_split_points,
)
from accelerando.backends.strategies.pipeline.stage import (
    PipelineLayout,
    build_schedule,
    build_traced_stage,
    microbatch,
)
from accelerando.big_modeling.budgets import convert_file_size_to_int
from accelerando.state import PartialState

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

__all__ = ["build_pipeline", "find_pippy_batch_size", "generate_device_map", "pippy_forward", "prepare_pippy"]


def generate_device_map(
    model: torch.nn.Module,
    num_processes: int = 1,
    no_split_module_classes: list[str] | None = None,
    max_memory: dict | None = None,
) -> dict[str, int]:
    """Assign the model's pieces to ``num_processes`` pipeline stages, balancing parameter bytes.

    Args:
        model: the model to split.
        num_processes: stages (one per process).
        no_split_module_classes: class names a stage boundary never cuts through (default: the
            model's ``_no_split_modules``).
        max_memory: ``{stage index: bytes or "10GiB"}``; the stages get parts in proportion to it
            (equal parts when None).

    Returns:
        ``{module name: stage index}`` in the model's registration order.

    Raises:
        ValueError: fewer pieces than processes.
    """
    capacities = None
    if max_memory:
        capacities = {
            int(k): float(convert_file_size_to_int(v) if isinstance(v, str) else v)
            for k, v in max_memory.items()
            if str(k).isdigit()
        }
    return generate_stage_map(model, num_processes, no_split_module_classes, capacities)


def find_pippy_batch_size(args: Sequence[object], kwargs: Mapping[str, object]) -> int | None:
    """The size of dim 0 of the first tensor among ``args`` then ``kwargs`` (None without a tensor)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return None


def _layout() -> PipelineLayout:
    PartialState()  # sets up the process group of a launched job
    return PipelineLayout.whole_world()


def build_pipeline(
    model: torch.nn.Module,
    split_points: list[str],
    args: tuple[object, ...],
    kwargs: Mapping[str, object],
    num_chunks: int,
) -> PipelineScheduleSingle:
    """Trace ``model`` on one micro-batch of the examples and build this process's stage and schedule.

    Returns:
        The ``ScheduleGPipe`` running this process's stage (its ``step`` runs one batch).

    Raises:
        RuntimeError: the model cannot be traced as one graph.
        ValueError: the split points do not give one stage per process.
    """
    layout = _layout()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    stage = build_traced_stage(
        model,
        split_points,
        tuple(microbatch(arg, num_chunks) for arg in args),
        {key: microbatch(value, num_chunks) for key, value in kwargs.items()},
        layout,
        device,
    )
    return build_schedule(stage, "GPipe", num_chunks)


def pippy_forward(
    forward: Callable[..., object], num_chunks: int, gather_output: bool, *args: object, **kwargs: object
) -> object:
    """Run one batch through the pipeline (``forward`` is the schedule's ``step``).

    The first stage feeds ``args`` / ``kwargs``; the others feed nothing. Returns the output on the
    last process (None elsewhere), or on every process when ``gather_output``.

    Raises:
        ValueError: the batch size is not divisible by ``num_chunks``.
    """
    import torch.distributed as dist

    layout = _layout()
    batch = find_pippy_batch_size(args, kwargs)
    if batch is not None and batch % num_chunks:
        raise ValueError(
            f"batch size {batch} is not divisible by num_chunks={num_chunks}; pad the batch or change num_chunks"
        )
    with torch.no_grad():
        output = forward(*args, **kwargs) if layout.is_first else forward()
    if not layout.is_last:
        output = None
    if gather_output:
        holder = [output]
        dist.broadcast_object_list(holder, src=layout.last_rank, group=layout.group)
        output = holder[0]
    return output


def prepare_pippy(
    model: torch.nn.Module,
    split_points: str | list[str] | None = "auto",
    no_split_module_classes: list[str] | None = None,
    example_args: tuple[object, ...] | None = (),
    example_kwargs: dict[str, object] | None = None,
    num_chunks: int | None = None,
    gather_output: bool | None = False,
) -> torch.nn.Module:
    """Cut ``model`` into one pipeline stage per process for inference; returns the model, ready to call.

    Args:
        model: the whole model, on every process (each keeps running only its stage).
        split_points: ``"auto"`` (balance by parameter bytes) or the module names where stages 1..n-1 begin.
        no_split_module_classes: class names ``"auto"`` never cuts through.
        example_args: a full example batch (positional), used to trace the model; its batch size
            must be divisible by ``num_chunks`` and later calls use the same shapes.
        example_kwargs: the keyword part of the example batch.
        num_chunks: micro-batches per batch (default: the number of processes).
        gather_output: send the output to every process (else only the last one gets it).

    Returns:
        ``model`` with its ``forward`` running the pipeline; ``model.hf_split_points`` lists the cuts.

    Raises:
        ValueError: no example inputs, bad split points, or a batch not divisible by ``num_chunks``.
        RuntimeError: a single process (launch several), or a model that cannot be traced.

    Example:
        >>> # in a script started with: accelerando launch --num_processes 2 script.py
        >>> from accelerando import prepare_pippy
        >>> inputs = torch.randint(0, 1000, (2, 128))  # doctest: +SKIP
        >>> model = prepare_pippy(model, split_points="auto", example_args=(inputs,))  # doctest: +SKIP
        >>> with torch.no_grad():  # doctest: +SKIP
        ...     output = model(inputs)  # the last stage's output
    """
    example_kwargs = dict(example_kwargs or {})
    example_args = tuple(example_args or ())
    layout = _layout()
    if num_chunks is None:
        num_chunks = layout.num_stages
    batch = find_pippy_batch_size(example_args, example_kwargs)
    if batch is None:
        raise ValueError(
            "prepare_pippy needs example_args or example_kwargs holding a batch tensor to trace the model"
        )
    if batch % num_chunks:
        raise ValueError(
            f"the example batch has {batch} rows, not divisible by num_chunks={num_chunks}; use a batch size that "
            "is a multiple of num_chunks (the number of processes by default)"
        )

    if split_points in ("auto", None):
        points = balanced_split_points(model, layout.num_stages, no_split_module_classes)
    elif isinstance(split_points, str):
        raise ValueError(f"split_points={split_points!r}; give 'auto' or a list of module names")
    else:
        points = validate_split_points(model, split_points, layout.num_stages)
    schedule = build_pipeline(model, points, example_args, example_kwargs, num_chunks)
    # torch types Module.__setattr__'s value as Tensor | Module; a plain attribute is accepted too.
    model._pippy_schedule = schedule  # pyright: ignore[reportArgumentType]
    model.hf_split_points = points  # pyright: ignore[reportArgumentType]
    model.forward = functools.partial(pippy_forward, schedule.step, num_chunks, bool(gather_output))
    return model
