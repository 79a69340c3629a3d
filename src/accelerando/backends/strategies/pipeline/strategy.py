"""PipelineStrategy: train a model cut into stages, one stage per process (torch.distributed.pipelining)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from typing_extensions import override

from accelerando.backends.precision.base import Precision
from accelerando.backends.strategies.base import Strategy
from accelerando.backends.strategies.pipeline.data_parallel import (
    build_pipeline_mesh,
    pipeline_data_parallel_sizes,
)
from accelerando.backends.strategies.pipeline.model import PipelineModel
from accelerando.backends.strategies.pipeline.split import balanced_split_points, validate_split_points
from accelerando.backends.strategies.pipeline.stage import PipelineLayout
from accelerando.common.constants import OPTIMIZER_NAME
from accelerando.core.gradient_state import GradientState
from accelerando.core.runtime import Plugins, ProcessContext, Runtime
from accelerando.plugins.pipeline import PipelineParallelPlugin

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["PipelineStrategy", "merge_stage_optimizer_states"]


def _plugin(plugins: Plugins) -> PipelineParallelPlugin:
    """The PipelineParallelPlugin among the kwargs handlers (a default one when absent)."""
    found = plugins.handler(PipelineParallelPlugin)
    return found if found is not None else PipelineParallelPlugin()


@contextlib.contextmanager
def _grad_sync(model: object, value: bool) -> Iterator[None]:
    """Set ``model.require_grad_sync`` (a :class:`PipelineModel`) for the block; other models: no-op."""
    if not isinstance(model, PipelineModel):
        yield
        return
    old, model.require_grad_sync = model.require_grad_sync, value
    try:
        yield
    finally:
        model.require_grad_sync = old


class PipelineStrategy(Strategy):
    """Pipeline parallelism, alone or times data parallelism: each process runs one stage of one pipeline.

    Chosen by the connector when a ``PipelineParallelPlugin`` is among the kwargs handlers. With
    ``pp_size`` stages and ``N`` processes, ``N / pp_size`` pipelines train side by side on a mesh
    ``("dp_replicate", "pp")`` (see :mod:`accelerando.backends.strategies.pipeline.data_parallel`): each reads
    its own shard of the data, and the gradients of each stage are averaged over the pipelines after
    every pipeline call outside ``no_sync``. The prepared model is a :class:`PipelineModel`:
    ``out = model(x, target=y)`` runs forward and backward of the whole batch,
    ``accelerator.backward(out.loss)`` then only checks that this happened. Every process holds the
    whole model; the optimizer updates the parameters that have gradients (this process's stage).

    Raises:
        ValueError: ``pp_size`` not dividing the number of processes, a ParallelismConfig with other
            axes, or mixed precision fp16.
        RuntimeError: fewer than two processes.
    """

    name = "pipeline"
    # No capability interface (strategies/base.py, checkpointing/target.py): torch's autocast and loss
    # scaler; each process holds one stage, whose full state dict checkpointing loads as usual.

    def __init__(self, runtime: Runtime, precision: Precision, **options: object) -> None:
        super().__init__(runtime, precision, **options)
        self.distributed_type = runtime.distributed_type
        self.plugin = _plugin(runtime.plugins)
        self.pp_size, self.dp_size = pipeline_data_parallel_sizes(
            self.plugin.pp_size, runtime.num_processes, runtime.plugins.parallelism_config
        )
        if precision.scaler is not None:
            raise ValueError(
                "pipeline parallelism runs backward inside the schedule, where the fp16 loss scaler cannot act; "
                "use mixed_precision='bf16' or 'no'"
            )
        if runtime.mesh is None:
            raise ValueError(
                "the pipeline strategy runs on the mesh of its own_mesh(); build it with the connector"
            )
        #: The job's mesh, ``("pp",)`` or ``("dp_replicate", "pp")``: ranks along "pp" read the same batch.
        self.data_mesh = runtime.mesh
        self.layout = PipelineLayout.from_mesh(self.data_mesh)
        self._models: list[PipelineModel] = []

    @classmethod
    def own_mesh(cls, plugins: Plugins, process: ProcessContext) -> DeviceMesh | None:
        """The job's ``("pp",)`` or ``("dp_replicate", "pp")`` mesh, from the plugin's ``pp_size``.

        Collective (creates the axes' groups): every process builds it at the same point of the
        connector's build.

        Raises:
            ValueError: ``pp_size`` not dividing the number of processes, or a ParallelismConfig with
                other axes.
        """
        pp_size, dp_size = pipeline_data_parallel_sizes(
            _plugin(plugins).pp_size, process.num_processes, plugins.parallelism_config
        )
        return build_pipeline_mesh(process.device.type, pp_size, dp_size)

    @property
    def device_mesh(self) -> DeviceMesh:
        """The mesh this strategy runs on (the same object as ``data_mesh``)."""
        return self.data_mesh

    # ------------------------------------------------------------------ wrap
    @override
    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool = True, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        model = super().prepare_model(model, device_placement, evaluation_mode)
        plugin = self.plugin
        if plugin.split_points == "auto":
            points = balanced_split_points(model, self.layout.num_stages, plugin.no_split_module_classes)
        else:
            points = validate_split_points(model, plugin.split_points, self.layout.num_stages)

        wrapped = PipelineModel(
            model,
            self.layout,
            points,
            plugin.schedule,
            plugin.num_microbatches or self.layout.num_stages,
            plugin.loss_fn,
            loss_divisor=lambda: GradientState().num_steps,
            device=self.runtime.device,
        )
        self._models.append(wrapped)
        return wrapped

    @override
    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> torch.nn.Module:
        if isinstance(model, PipelineModel):
            model = model.module
        return super().unwrap_model(model, keep_fp32_wrapper, keep_torch_compile)

    # -------------------------------------------------------------- training
    def backward(self, loss: torch.Tensor, **kwargs: object) -> None:
        """Nothing to run: the pipeline call already back-propagated; checks that one happened.

        Raises:
            RuntimeError: ``loss`` carries a graph (it was not the pipeline call's ``loss``) or no
                pipeline training call ran since the last backward.
        """
        pending = [m for m in self._models if m.pending_backward > 0]
        if loss.requires_grad or not pending:
            raise RuntimeError(
                "with pipeline parallelism the backward pass runs inside the model call: use "
                "`out = model(inputs, target=labels)` in train mode, then `accelerator.backward(out.loss)`"
            )
        for model in pending:
            model.pending_backward = 0

    def _stage_parameters(self, parameters: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        return [p for p in parameters if p.grad is not None]

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip by the norm over ALL stages' gradients (each process holds its stage's).

        The norm is reduced over the pipeline's stages only: the data-parallel copies of a stage hold
        the same (already averaged) gradients, so counting them again would inflate the norm.
        """
        grads = [p.grad for p in self._stage_parameters(parameters) if p.grad is not None]
        device = self.runtime.device
        norm_type = float(norm_type)
        norms = [g.detach().norm(norm_type).float() for g in grads]
        if norm_type == float("inf"):
            local = torch.stack(norms).max() if norms else torch.zeros((), device=device)
            dist.all_reduce(local, op=dist.ReduceOp.MAX, group=self.layout.group)
            total = local
        else:
            local = (
                torch.stack([n**norm_type for n in norms]).sum() if norms else torch.zeros((), device=device)
            )
            dist.all_reduce(local, group=self.layout.group)
            total = local ** (1.0 / norm_type)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for grad in grads:
            grad.detach().mul_(coef.to(grad.device))
        return total

    def _no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Pipeline calls inside keep their gradients local (no all-reduce over the pipelines)."""
        return _grad_sync(model, False)

    def trigger_sync_in_backward(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """The next pipeline call averages gradients over the pipelines, even inside ``no_sync``."""
        return _grad_sync(model, True)

    # ------------------------------------------------------------ state dicts
    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict: every stage's current tensors, gathered from their owners.

        Each process holds a full copy, but only its own stage's part is trained; the other parts
        are taken from the processes that own them. Collective: call it on every process.
        """
        full = super().model_state_dict(model)
        stage = model.stage_module() if isinstance(model, PipelineModel) else None
        mine = {}
        if stage is not None:
            mine = {k: v.detach().cpu() for k, v in stage.state_dict().items() if k in full}
        gathered: list[dict[str, torch.Tensor] | None] = [None] * self.layout.num_stages
        dist.all_gather_object(gathered, mine, group=self.layout.group)
        for part in gathered:
            for key, value in (part or {}).items():
                full[key] = value.to(full[key].device)
        return full

    # ------------------------------------------------------------ checkpoints
    def save_optimizer_checkpoint(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None, output_dir: str, index: int
    ) -> bool:
        """Write ONE optimizer file holding every stage's state (``optimizer.bin``, as unsplit training).

        Each process's optimizer holds state only for its stage's parameters (the others never get a
        gradient). The states of the pipeline's stages are merged by parameter index, and the main
        process writes the result under the usual name, so checkpointing's default loading restores
        it on every process (and in a run without pipeline). Collective over the whole job: called on
        every process.
        """
        inner = getattr(optimizer, "optimizer", optimizer)
        merged = merge_stage_optimizer_states(inner.state_dict(), self.layout.group, self.layout.num_stages)
        name = f"{OPTIMIZER_NAME}.bin" if index == 0 else f"{OPTIMIZER_NAME}_{index}.bin"
        path = os.path.join(output_dir, name)
        if self.runtime.is_main_process:
            torch.save(merged, path)
        # Without a shared file system (save_on_each_node) every node's folder needs the file: after the
        # main process wrote it, each node's first process writes it where it is still missing.
        dist.barrier()
        if self.runtime.is_local_main_process and not os.path.exists(path):
            torch.save(merged, path)
        return True


def merge_stage_optimizer_states(
    state_dict: Mapping[str, object], group: dist.ProcessGroup | None, num_stages: int
) -> dict[str, object]:
    """The optimizer state dict of the whole model from each stage's (collective over ``group``).

    Every stage's optimizer is built over the whole model (same parameter groups and indices) but has
    per-parameter state only for the parameters it stepped; the union of those is the full state.

    Raises:
        ValueError: two stages hold state for the same parameter (a parameter trained by two stages).
    """
    per_parameter = state_dict["state"]
    assert isinstance(per_parameter, dict), "an optimizer state dict holds a 'state' dict"
    mine = {
        k: {n: v.detach().cpu() if isinstance(v, torch.Tensor) else v for n, v in st.items()}
        for k, st in per_parameter.items()
    }
    gathered: list[dict[int, dict[str, object]] | None] = [None] * num_stages
    dist.all_gather_object(gathered, mine, group=group)
    state: dict[int, dict[str, object]] = {}
    for part in gathered:
        for key, value in (part or {}).items():
            if key in state:
                raise ValueError(
                    f"optimizer state of parameter {key} is held by two pipeline stages; a parameter shared "
                    "between stages (tied weights) cannot be checkpointed per stage: untie it or keep it in one stage"
                )
            state[key] = value
    return {"state": dict(sorted(state.items())), "param_groups": state_dict["param_groups"]}
