"""PipelineParallelPlugin: pipeline-parallel training over ``torch.distributed.pipelining``.

Beyond the reference: Accelerate's ``ParallelismConfig`` has no pipeline axis and its only pipeline
path is inference (``prepare_pippy``). Pass this handler in ``kwargs_handlers`` to train with the
model cut into stages, one per process::

    plugin = PipelineParallelPlugin(split_points=["layers.2"], schedule="1F1B", num_microbatches=4,
                                    loss_fn=torch.nn.functional.cross_entropy)
    accelerator = Accelerator(kwargs_handlers=[plugin])

With ``pp_size`` smaller than the number of processes (e.g. 4 processes, ``pp_size=2``) the job runs
``num_processes / pp_size`` pipelines as data-parallel replicas (pipeline x data parallelism).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from accelerando.plugins.kwargs_handler import KwargsHandler

if TYPE_CHECKING:
    import torch

__all__ = ["PipelineParallelPlugin"]

_SCHEDULES = ("gpipe", "1f1b")


@dataclass
class PipelineParallelPlugin(KwargsHandler):
    """How to cut the model into pipeline stages and run them (accelerando-specific, not in the reference).

    Args:
        split_points: module names (as in ``model.named_modules()``) where stages 1..n-1 begin, or
            ``"auto"`` to balance the stages by parameter bytes.
        schedule: ``"GPipe"`` (all forwards, then all backwards) or ``"1F1B"`` (interleaved, less
            activation memory).
        num_microbatches: micro-batches each batch is cut into (dim 0); None = one per stage. The
            batch size must be divisible by it for results equal to an unsplit run.
        loss_fn: ``loss_fn(output, target) -> scalar`` computed on the last stage; needed to train.
        pp_size: stages of one pipeline; None = every process. With ``N`` processes, ``N / pp_size``
            pipelines train side by side as data-parallel replicas (each reads its own shard of the
            data; gradients are averaged over them); ``pp_size`` must divide ``N``.
        no_split_module_classes: class names never cut through by ``split_points="auto"`` (default:
            the model's ``_no_split_modules``).

    Raises:
        ValueError: an unknown schedule, ``num_microbatches`` or ``pp_size`` below 1 / 2, or
            ``split_points`` neither ``"auto"`` nor a list of names.
    """

    split_points: str | list[str] = "auto"
    schedule: str = "GPipe"
    num_microbatches: int | None = None
    loss_fn: Callable[..., torch.Tensor] | None = None
    pp_size: int | None = None
    no_split_module_classes: list[str] | None = None

    def __post_init__(self) -> None:
        if str(self.schedule).lower() not in _SCHEDULES:
            raise ValueError(f"PipelineParallelPlugin.schedule={self.schedule!r}; choose 'GPipe' or '1F1B'")
        if self.num_microbatches is not None and (
            not isinstance(self.num_microbatches, int) or self.num_microbatches < 1
        ):
            raise ValueError(
                f"PipelineParallelPlugin.num_microbatches must be an integer >= 1, got {self.num_microbatches!r}"
            )
        if self.pp_size is not None and (not isinstance(self.pp_size, int) or self.pp_size < 2):
            raise ValueError(
                f"PipelineParallelPlugin.pp_size must be an integer >= 2 (a pipeline of one stage is plain "
                f"training: drop the plugin), got {self.pp_size!r}"
            )
        if isinstance(self.split_points, str):
            if self.split_points != "auto":
                raise ValueError(
                    f"PipelineParallelPlugin.split_points={self.split_points!r}; give 'auto' or a list of module names"
                )
        else:
            self.split_points = list(self.split_points)

    @property
    def enabled(self) -> bool:
        """Always True: passing the plugin asks for pipeline parallelism."""
        return True
