"""PipelineStrategy: train a model cut into stages, one stage per process (torch.distributed.pipelining)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from accelerando.strategies.base import Strategy
from accelerando.strategies.pipeline.model import PipelineModel
from accelerando.strategies.pipeline.split import balanced_split_points, validate_split_points
from accelerando.strategies.pipeline.stage import PipelineLayout

__all__ = ["PipelineStrategy"]


def _plugin() -> Any:
    """The PipelineParallelPlugin among the active runtime's handlers (the connector activates it first)."""
    import accelerando.runtime as rt
    from accelerando.plugins.pipeline import PipelineParallelPlugin

    current = rt.current()
    found = current.plugins.handler(PipelineParallelPlugin) if current is not None else None
    return found if found is not None else PipelineParallelPlugin()


class PipelineStrategy(Strategy):
    """Pipeline parallelism: each process runs one stage; micro-batches flow through a schedule.

    Chosen by the connector when a ``PipelineParallelPlugin`` is among the kwargs handlers. The
    prepared model is a :class:`PipelineModel`: ``out = model(x, target=y)`` runs forward and
    backward of the whole batch, ``accelerator.backward(out.loss)`` then only checks that this
    happened. Every process holds the whole model and feeds the same batch; the optimizer updates
    the parameters that have gradients (this process's stage).

    Raises:
        ValueError: ``pp_size`` other than the number of processes, or mixed precision fp16.
        RuntimeError: fewer than two processes.
    """

    name = "pipeline"
    plain_data_parallel = False

    def __init__(self, state: Any, precision: Any, **options: Any) -> None:
        super().__init__(state, precision, **options)
        self.distributed_type = state.distributed_type
        self.plugin = _plugin()
        world = int(state.num_processes)
        if world < 2:
            raise RuntimeError(
                "PipelineParallelPlugin needs at least 2 processes (one per stage); launch with "
                "`accelerando launch --num_processes 2 script.py` or drop the plugin"
            )
        pp = self.plugin.pp_size or world
        if pp != world:
            raise ValueError(
                f"PipelineParallelPlugin(pp_size={pp}) with {world} processes: pipeline x data parallel is not "
                f"supported yet; set pp_size={world} (or leave it None) or launch {pp} processes"
            )
        if getattr(precision, "scaler", None) is not None:
            raise ValueError(
                "pipeline parallelism runs backward inside the schedule, where the fp16 loss scaler cannot act; "
                "use mixed_precision='bf16' or 'no'"
            )
        config = getattr(state, "parallelism_config", None)
        if config is not None and (config.tp_enabled or config.cp_enabled or config.dp_shard_enabled):
            raise ValueError(
                f"PipelineParallelPlugin with ParallelismConfig(tp_size={config.tp_size}, cp_size={config.cp_size}, "
                f"dp_shard_size={config.dp_shard_size}): pipeline parallelism does not combine with other axes yet; "
                "drop the ParallelismConfig sizes or the plugin"
            )
        self.layout = PipelineLayout.whole_world()
        self.data_mesh = self._data_mesh()
        self._models: list[PipelineModel] = []

    def _data_mesh(self) -> Any:
        """A 1-D mesh named "pp": every process of it reads the same batches (None if not buildable)."""
        try:
            from torch.distributed.device_mesh import init_device_mesh

            return init_device_mesh(self.state.device.type, (self.layout.num_stages,), mesh_dim_names=("pp",))
        except Exception:  # a mesh is only a hint for the dataloader; the pipeline runs without it
            return None

    # ------------------------------------------------------------------ wrap
    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool = True, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        model = super().prepare_model(model, device_placement, evaluation_mode)
        plugin = self.plugin
        if plugin.split_points == "auto":
            points = balanced_split_points(model, self.layout.num_stages, plugin.no_split_module_classes)
        else:
            points = validate_split_points(model, plugin.split_points, self.layout.num_stages)
        from accelerando.gradient_state import GradientState

        wrapped = PipelineModel(
            model,
            self.layout,
            points,
            plugin.schedule,
            plugin.num_microbatches or self.layout.num_stages,
            plugin.loss_fn,
            loss_divisor=lambda: GradientState().num_steps,
            device=self.state.device,
        )
        self._models.append(wrapped)
        return wrapped

    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> torch.nn.Module:
        if isinstance(model, PipelineModel):
            model = model.module
        return super().unwrap_model(model, keep_fp32_wrapper, keep_torch_compile)

    # -------------------------------------------------------------- training
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
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
        """Clip by the norm over ALL stages' gradients (each process holds its stage's)."""
        params = self._stage_parameters(parameters)
        device = self.state.device
        norm_type = float(norm_type)
        norms = [p.grad.detach().norm(norm_type).float() for p in params]
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
        for p in params:
            p.grad.detach().mul_(coef.to(p.grad.device))
        return total

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

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
        gathered: list[Any] = [None] * self.layout.num_stages
        dist.all_gather_object(gathered, mine, group=self.layout.group)
        for part in gathered:
            for key, value in (part or {}).items():
                full[key] = value.to(full[key].device)
        return full

    # ------------------------------------------------------------ checkpoints
    def save_optimizer_checkpoint(self, optimizer: Any, model: Any, output_dir: str, index: int) -> bool:
        """Each stage writes its own optimizer state (``optimizer_<i>.stage<k>.bin``)."""
        inner = getattr(optimizer, "optimizer", optimizer)
        path = os.path.join(output_dir, f"optimizer_{index}.stage{self.layout.stage_index}.bin")
        torch.save(inner.state_dict(), path)
        return True

    def load_optimizer_checkpoint(self, optimizer: Any, model: Any, input_dir: str, index: int) -> bool:
        """Load the optimizer state this stage wrote; False when the checkpoint has none."""
        path = os.path.join(input_dir, f"optimizer_{index}.stage{self.layout.stage_index}.bin")
        if not os.path.exists(path):
            return False
        inner = getattr(optimizer, "optimizer", optimizer)
        inner.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return True
