"""ComposableStrategy: tensor parallelism and FSDP2 composed on the ParallelismConfig's device mesh.

``prepare_model`` applies, in this order (each step is logged with what it did):

1. tensor parallelism on the ``tp`` axis: the model's plan (transformers ``tp_plan``), or the one
   given in ``TorchTensorParallelPlugin(tp_plan=...)``, through torch's ``parallelize_module``;
2. FSDP2 ``fully_shard`` on the ``dp_shard`` axis (parameters become 2-D DTensors with ``tp``),
   over ``(dp_replicate, dp_shard)`` when both are set (HSDP: shards replicated across groups).

Ranks that differ only along ``tp`` read the same batches (the facade gives dataloaders the mesh);
gradients of the ``tp`` ranks of one data-parallel group are identical, so nothing is averaged
across ``tp``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

import accelerando.backends.strategies.composable.grads as G
import accelerando.backends.strategies.ties as T
from accelerando.backends.precision.base import Precision
from accelerando.backends.strategies.base import Strategy
from accelerando.backends.strategies.composable.checks import check_heads
from accelerando.backends.strategies.composable.plan import module_plan, resolve_plan, to_parallel_style
from accelerando.backends.strategies.fsdp.state import (
    full_model_state_dict,
    load_full_model_state_dict,
    load_full_optimizer_state_dict,
    load_sharded_model,
    load_sharded_optimizer,
    save_sharded_model,
    save_sharded_optimizer,
)
from accelerando.backends.strategies.fsdp.sync import FSDP2GradientSync, is_fsdp2
from accelerando.backends.strategies.fsdp.wrap import (
    apply_activation_checkpointing,
    reshard_after_forward_for,
    wrap_units,
)
from accelerando.checkpointing import files as F
from accelerando.checkpointing.target import LoadsOwnCheckpoints
from accelerando.common.other import get_model_tp_size
from accelerando.core.runtime import Runtime

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle

__all__ = ["ComposableStrategy"]

logger = logging.getLogger(__name__)


class ComposableStrategy(LoadsOwnCheckpoints, Strategy):
    """Tensor parallel (``tp``) x FSDP2 (``dp_shard``) x replication (``dp_replicate``) on one mesh.

    The connector picks it when a ``ParallelismConfig`` has ``tp_size > 1``, or ``dp_shard_size > 1``
    without an FSDP plugin. An FSDP plugin, when given, supplies the FSDP2 options (which layers are
    sharded units, ``reshard_after_forward``, mixed precision, CPU offload).

    Attributes:
        applied: one line per step applied to each prepared model, in order (also logged).

    Raises:
        ValueError: no device mesh (no ParallelismConfig), an FSDP plugin asking for FSDP1, or a
            tensor-parallel degree the model cannot take (see :meth:`prepare_model`).
    """

    name = "composable"

    def __init__(self, runtime: Runtime, precision: Precision, **options: object) -> None:
        super().__init__(runtime, precision, **options)
        self.distributed_type = runtime.distributed_type
        mesh, config = runtime.mesh, runtime.plugins.parallelism_config
        if mesh is None or config is None:
            raise ValueError(
                "the composable strategy lays models out on a ParallelismConfig's device mesh and this job has "
                "none; pass Accelerator(parallelism_config=ParallelismConfig(tp_size=..., dp_shard_size=...))"
            )
        self.mesh, self.config = mesh, config
        self.tp_plugin = runtime.plugins.torch_tp
        self.fsdp_plugin = runtime.plugins.fsdp
        if self.fsdp_plugin is not None and self.fsdp_plugin.fsdp_version != 2:
            raise ValueError(
                f"ParallelismConfig shards with FSDP2 but the FSDP plugin asks for fsdp_version="
                f"{self.fsdp_plugin.fsdp_version}; set fsdp_version=2 (or drop the plugin)"
            )
        local_world = runtime.cluster.local_world_size
        if local_world and self.config.tp_size > local_world:
            logger.warning(
                "tp_size=%d spans more than one machine (%d processes per machine): tensor-parallel collectives "
                "run on every layer, so keep tp_size <= %d and put the other processes on dp_shard",
                self.config.tp_size,
                local_world,
                local_world,
            )
        self.applied: list[str] = []
        self._param_map: dict[int, tuple[weakref.ref, torch.nn.Parameter]] = {}
        self._models: list[torch.nn.Module] = []
        self._optimizer_models: dict[int, torch.nn.Module] = {}
        self._sync = FSDP2GradientSync()

    # ------------------------------------------------------------------ mesh
    @property
    def tp_mesh(self) -> DeviceMesh | None:
        """The 1-D ``tp`` sub-mesh, or None without tensor parallelism."""
        return self.mesh["tp"] if self.config.tp_enabled else None

    @property
    def fsdp_mesh(self) -> DeviceMesh | None:
        """The sub-mesh FSDP2 shards over (``dp_shard``, or ``dp_replicate x dp_shard``); None without sharding."""
        if not self.config.dp_shard_enabled:
            return None
        dims = tuple(d for d in ("dp_replicate", "dp_shard") if getattr(self.config, f"{d}_size") > 1)
        return self.mesh[dims[0]] if len(dims) == 1 else self.mesh[dims]

    def _note(self, line: str) -> None:
        self.applied.append(line)
        if self.runtime.is_main_process:
            logger.info(line)

    # ------------------------------------------------------------------ wrap
    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool = True, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Lay ``model`` out on the mesh: tensor parallel on ``tp``, then FSDP2 on the data axes.

        Every process's weights are first replaced by process 0's, so that a model initialised
        differently on each process still trains as one. Tied parameters stay one parameter (one
        DTensor under every name; an optimizer holds it once, ``save_model`` writes it once).

        Raises:
            ValueError: the model has no tensor-parallel plan and none was given, the plan names
                nothing in the model, ``tp_size`` does not divide the head counts of its config,
                the model was already split with another tensor-parallel degree, the plan splits a
                tied parameter (e.g. ``tie_word_embeddings=True``) differently for its users, or the
                FSDP plugin asks for ``cpu_ram_efficient_loading``.
        """
        if any(model is m for m in self._models):
            return model
        before = dict(model.named_parameters())
        model = super().prepare_model(model, device_placement, evaluation_mode)
        if device_placement:
            before = dict(model.named_parameters())
        label = type(model).__name__
        if not any(p.is_meta for p in model.parameters()):
            self._broadcast_from_first(model)
        if self.config.tp_enabled:
            self._apply_tensor_parallel(model, label)
        if self.config.dp_shard_enabled and any(p.requires_grad for p in model.parameters()):
            self._apply_fsdp(model, label)
        # activation-checkpoint wrappers add a name level that the user's names do not have
        after = {n.replace("_checkpoint_wrapped_module.", ""): p for n, p in model.named_parameters()}
        self._param_map = {k: v for k, v in self._param_map.items() if v[0]() is not None}
        for name, old in before.items():
            new = after.get(name)
            if new is not None and new is not old:
                self._param_map[id(old)] = (weakref.ref(old), new)
        self._models.append(model)
        return model

    @staticmethod
    def _broadcast_from_first(model: torch.nn.Module) -> None:
        from torch.distributed.tensor import DTensor

        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                if not isinstance(tensor, DTensor):
                    dist.broadcast(tensor.data, src=0)

    def _plan_for(self, model: torch.nn.Module) -> dict[str, object]:
        given = getattr(self.tp_plugin, "tp_plan", None)
        plan = dict(given) if given else module_plan(model)
        if not plan:
            raise ValueError(
                f"tensor parallelism (tp_size={self.config.tp_size}) needs a plan saying how to split "
                f"{type(model).__name__}, which declares none (transformers models carry one as tp_plan); pass "
                "Accelerator(torch_tp_plugin=TorchTensorParallelPlugin(tp_size=..., tp_plan={'layers.*.proj': "
                "'colwise', ...})) or a transformers model with a tp_plan"
            )
        return plan

    def _apply_tensor_parallel(self, model: torch.nn.Module, label: str) -> None:
        from torch.distributed.tensor.parallel import parallelize_module

        tp_size = self.config.tp_size
        existing = get_model_tp_size(model)
        if existing is not None and existing > 1:
            if existing != tp_size:
                raise ValueError(
                    f"{label} is already split for tensor parallelism of degree {existing} but the "
                    f"ParallelismConfig has tp_size={tp_size}; load the model unsplit or use tp_size={existing}"
                )
            self._note(f"1. tensor parallel: {label} already split over tp={tp_size}; left as loaded")
            return
        check_heads(model, tp_size)
        styles: dict[str, ParallelStyle] = {}
        counts: dict[str, int] = {}
        resolved = resolve_plan(model, self._plan_for(model))
        for name, style in resolved.items():
            parallel = to_parallel_style(style, model.get_submodule(name), name)
            if parallel is not None:
                styles[name] = parallel
                key = style if isinstance(style, str) else type(style).__name__
                counts[key] = counts.get(key, 0) + 1
        ties = T.find_ties(model)
        # Weights are already the same on every process (broadcast above): each keeps its slice
        # without a second broadcast.
        parallelize_module(model, self.tp_mesh, styles, src_data_rank=None)
        # parallelize_module gives each split module a parameter of its own, which unties shared
        # weights: re-point the names at one split tensor (refused when they were split differently).
        retied = T.check_ties(model, ties, resolved)
        T.retie(model, retied)
        summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        tied = f"; re-tied {', '.join(' = '.join(g) for g in retied)}" if retied else ""
        self._note(f"1. tensor parallel: {label} split over tp={tp_size} ({summary}){tied}")

    def _apply_fsdp(self, model: torch.nn.Module, label: str) -> None:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        plugin = self.fsdp_plugin
        units, dropped = self._fsdp_units(model)
        reshard_after_forward: bool | None = None  # fully_shard's defaults, unless the plugin says
        mp_policy = MixedPrecisionPolicy()
        offload_policy = OffloadPolicy()
        if plugin is not None:
            if plugin.cpu_ram_efficient_loading:
                raise ValueError(
                    "cpu_ram_efficient_loading=True is not supported on a ParallelismConfig mesh (the model is "
                    "split by tensor parallelism before it is sharded); set cpu_ram_efficient_loading=False"
                )
            if plugin.activation_checkpointing:
                units = apply_activation_checkpointing(model, units)

            dtypes = plugin.mixed_precision_dtypes() or {}
            reshard_after_forward = reshard_after_forward_for(plugin.resolved_sharding())
            mp_policy = MixedPrecisionPolicy(
                param_dtype=dtypes.get("param_dtype"), reduce_dtype=dtypes.get("reduce_dtype")
            )
            offload = plugin.cpu_offload
            if isinstance(offload, OffloadPolicy):
                offload_policy = offload
            elif offload:
                offload_policy = CPUOffloadPolicy(pin_memory=self.runtime.device.type == "cuda")
        for unit in [*units, model]:  # the units, then the root
            fully_shard(
                unit,
                mesh=self.fsdp_mesh,
                reshard_after_forward=reshard_after_forward,
                mp_policy=mp_policy,
                offload_policy=offload_policy,
            )
        sizes = " x ".join(
            f"{d}={getattr(self.config, f'{d}_size')}"
            for d in ("dp_replicate", "dp_shard")
            if getattr(self.config, f"{d}_size") > 1
        )
        kind = "HSDP" if self.config.dp_replicate_enabled else "FSDP2"
        left = (
            f"; {len(dropped)} unit(s) holding part of a tied parameter left to the enclosing one"
            if dropped
            else ""
        )
        self._note(f"2. {kind}: {label} sharded over {sizes} ({len(units)} units + root{left})")

    def _fsdp_units(self, model: torch.nn.Module) -> tuple[list[torch.nn.Module], list[torch.nn.Module]]:
        """The submodules sharded as their own units (the plugin's choice, else the model's no-split
        layers), less those holding only some users of a tied parameter; returns (units, those left out).
        """
        units: list[torch.nn.Module] = []
        if self.fsdp_plugin is not None:
            units = wrap_units(self.fsdp_plugin, model)
        if not units:
            names = set(getattr(model, "_no_split_modules", None) or ())
            units = [m for m in model.modules() if m is not model and type(m).__name__ in names]
        return T.units_keeping_ties(model, units)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Point ``optimizer`` at the laid-out parameters of the models prepared before it.

        When its parameters mix DTensors and plain tensors, ``step`` and ``zero_grad`` run with
        plain tensors taken as replicated (what they are), so ``foreach`` kernels accept them.

        Raises:
            ValueError: it already holds state for the parameters before the layout.
        """
        changed = 0
        for group in optimizer.param_groups:
            params = []
            for p in group["params"]:
                entry = self._param_map.get(id(p))
                if entry is not None and entry[0]() is p:
                    params.append(entry[1])
                    changed += 1
                else:
                    params.append(p)
            group["params"] = params
        if changed and optimizer.state:
            raise ValueError(
                "the optimizer already has state for the parameters before tensor parallelism / sharding; "
                "prepare it before its first step (or build it after accelerator.prepare(model))"
            )
        all_params = [p for g in optimizer.param_groups for p in g["params"]]
        if G.has_mixed_layouts(all_params):
            optimizer.step = G.step_with_replication(optimizer.step)  # type: ignore[method-assign]
            optimizer.zero_grad = G.step_with_replication(optimizer.zero_grad)  # type: ignore[method-assign]
        ids = {id(p) for p in all_params}
        for model in self._models:
            if any(id(p) in ids for p in model.parameters()):
                self._optimizer_models[id(optimizer)] = model
        return optimizer

    # -------------------------------------------------------------- training
    def _no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Accumulate gradients without the FSDP2 reduce-scatter (tensor-parallel collectives still run)."""
        return self._sync.no_sync(model)

    def trigger_sync_in_backward(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Force backwards inside this context to reduce gradients over the data-parallel axes."""
        return self._sync.trigger_sync_in_backward(model)

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip by the norm of the whole gradients (every shard and split counted once); return it."""
        return G.clip_grad_norm(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        """Clamp every gradient element, whatever its layout."""
        G.clip_grad_value(parameters, clip_value)

    # ------------------------------------------------------------ state dicts
    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full (gathered) state dict on the main process, on CPU; ``{}`` elsewhere. Call on every rank."""
        module = self.unwrap_model(model, keep_torch_compile=False)
        if not self._is_laid_out(module):
            return super().model_state_dict(model)
        # the gather copies each name of a tied parameter separately: share them again
        return T.share_tied_entries(full_model_state_dict(module), self._ties(module))

    def load_model_state_dict(
        self, model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], strict: bool = True
    ) -> object:
        """Load a full state dict (given on every rank); each rank keeps its slice."""
        module = self.unwrap_model(model, keep_torch_compile=False)
        if not self._is_laid_out(module):
            return super().load_model_state_dict(model, state_dict, strict)
        # weights files hold a tied tensor once: give its other names the same value
        state_dict = T.fill_tied_entries(state_dict, self._ties(module))
        return load_full_model_state_dict(module, state_dict, strict)

    @staticmethod
    def _ties(module: torch.nn.Module) -> list[list[str]]:
        """The tie groups of ``module`` by state-dict name (without activation-checkpoint wrappers)."""
        return [[n.replace("_checkpoint_wrapped_module.", "") for n in g] for g in T.find_ties(module)]

    @staticmethod
    def _is_laid_out(module: torch.nn.Module) -> bool:
        from torch.distributed.tensor import DTensor

        return is_fsdp2(module) or any(isinstance(p, DTensor) for p in module.parameters())

    # ------------------------------------------------------------ checkpoints
    def save_model_checkpoint(
        self, model: torch.nn.Module, output_dir: str, index: int, safe_serialization: bool
    ) -> bool:
        """Write each rank's slices with torch.distributed.checkpoint (``pytorch_model_fsdp_<index>/``)."""
        save_sharded_model(self.unwrap_model(model, keep_torch_compile=False), output_dir, index)
        return True

    def load_model_checkpoint(self, model: torch.nn.Module, input_dir: str, index: int) -> bool:
        """Load slices written by ``save_model_checkpoint``, or a full weights file; True when loaded."""
        module = self.unwrap_model(model, keep_torch_compile=False)
        if load_sharded_model(module, input_dir, index):
            return True

        self.load_model_state_dict(model, F.load_model_weights(F.find_model_file(input_dir, index)))
        return True

    def _model_for(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None) -> torch.nn.Module:
        inner = getattr(optimizer, "optimizer", optimizer)
        found = self._optimizer_models.get(id(inner))
        if found is not None:
            return found
        if model is not None:
            return model
        raise ValueError(
            "this optimizer was not prepared with a model laid out on the mesh; prepare both with "
            "accelerator.prepare"
        )

    def save_optimizer_checkpoint(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None, output_dir: str, index: int
    ) -> bool:
        """Write each rank's slice of the optimizer state (``optimizer_<index>/``); True."""
        inner = getattr(optimizer, "optimizer", optimizer)
        save_sharded_optimizer(self._model_for(optimizer, model), inner, output_dir, index)
        return True

    def load_optimizer_checkpoint(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None, input_dir: str, index: int
    ) -> bool:
        """Load what ``save_optimizer_checkpoint`` wrote (or a full optimizer file); True when loaded."""
        inner = getattr(optimizer, "optimizer", optimizer)
        owner = self._model_for(optimizer, model)
        if load_sharded_optimizer(owner, inner, input_dir, index):
            return True

        path = os.path.join(input_dir, F.indexed(F.OPTIMIZER_NAME, index, ".bin"))
        load_full_optimizer_state_dict(owner, inner, F.torch_load(path, "cpu"))
        return True
