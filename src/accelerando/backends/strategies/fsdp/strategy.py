"""FSDPStrategy: shard parameters, gradients and optimizer state across processes (FSDP2 or FSDP1).

Mixed precision: by default the Accelerator's precision plugin keeps wrapping forward in autocast
and FSDP keeps fp32 parameters and fp32 gradient reductions. That is numerically what DDP does, so
FSDP and DDP runs agree. A ``mixed_precision_policy`` on the plugin (or
``plugin.set_mixed_precision("bf16")``) additionally all-gathers and computes parameters in the low
dtype (half the communication and gathered memory) with reductions in the policy's ``reduce_dtype``;
autocast then stays on for the operations it upcasts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, TypeGuard, cast

import torch

import accelerando.backends.strategies.conversion as C
import accelerando.backends.strategies.fsdp.state as S
import accelerando.backends.strategies.fsdp.wrap as W
import accelerando.core.process_group as process_group
from accelerando.backends.precision.base import Precision
from accelerando.backends.strategies.base import Strategy
from accelerando.backends.strategies.fsdp.auto import ShardingChoice, choose_sharding_strategy
from accelerando.backends.strategies.fsdp.sync import FSDP2GradientSync
from accelerando.checkpointing import files as F
from accelerando.checkpointing.target import LoadsOwnCheckpoints
from accelerando.core.enums import DistributedType
from accelerando.core.runtime import Runtime
from accelerando.plugins.fsdp import FullyShardedDataParallelPlugin

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import OptimizerStateType
    from torch.distributed.fsdp import FullyShardedDataParallel

__all__ = ["FSDPStrategy"]

logger = logging.getLogger(__name__)

_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod.")


def _clean(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _is_fsdp1(model: object) -> TypeGuard[FullyShardedDataParallel]:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(model, FullyShardedDataParallel)


def _is_fsdp2(model: object) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


class FSDPStrategy(LoadsOwnCheckpoints, Strategy):
    """Fully Sharded Data Parallel, configured by a ``FullyShardedDataParallelPlugin``.

    The plugin is the one given to the Accelerator (``state.fsdp_plugin``), else one built from
    the settings. ``prepare_model`` shards; ``prepare_optimizer`` re-points an optimizer built over
    the original parameters to the sharded ones (FSDP2 replaces every parameter).

    A job of one process (``python script.py``, ``torchrun --nproc_per_node 1``) runs FSDP over a
    one-process group: the plugin's offloading and mixed-precision policy apply, nothing is sharded,
    and training matches plain PyTorch bit for bit.
    """

    distributed_type = DistributedType.FSDP
    name = "fsdp"

    def __init__(self, runtime: Runtime, precision: Precision, **options: object) -> None:
        super().__init__(runtime, precision, **options)
        if runtime.num_processes < 2:
            _one_process_group(runtime)
        # The connector puts the plugin in the runtime (one made from the settings when the user gave
        # none); the fallback serves a runtime built without one.
        plugin = runtime.plugins.fsdp
        if plugin is None:
            plugin = FullyShardedDataParallelPlugin()
        if not isinstance(plugin, FullyShardedDataParallelPlugin):
            raise TypeError(
                f"fsdp_plugin must be a FullyShardedDataParallelPlugin, got {type(plugin).__name__}"
            )
        self.plugin = plugin
        self.last_choice: ShardingChoice | None = None
        # id(original parameter) -> (weak ref to the original, sharded). Weak: holding the originals
        # would keep a full unsharded copy of every model alive; the ref also detects a reused id.
        self._param_map: dict[int, tuple[weakref.ref, torch.nn.Parameter]] = {}
        self._models: list[torch.nn.Module] = []
        self._optimizer_models: dict[int, torch.nn.Module] = {}
        self._sync = FSDP2GradientSync()

    # ------------------------------------------------------------------ wrap
    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool = True, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Shard ``model`` (FSDP2 in place, FSDP1 in a wrapper) and remember its new parameters.

        Raises:
            ValueError: a layer class name matches nothing, or "AUTO" finds no strategy that fits.
        """
        if _is_fsdp1(model) or _is_fsdp2(model):
            return model
        if evaluation_mode or not any(p.requires_grad for p in model.parameters()):
            return super().prepare_model(model, device_placement, evaluation_mode)
        strategy = self._sharding_for(model)
        before = dict(model.named_parameters())
        device = self.runtime.device
        on_meta = any(p.is_meta for p in model.parameters())
        if device_placement and not self.plugin.cpu_ram_efficient_loading and not on_meta:
            model = model.to(device)
            before = dict(model.named_parameters())
        is_main = self.runtime.is_main_process
        if self.plugin.fsdp_version == 2:
            local_world = self.runtime.cluster.local_world_size or self.runtime.num_processes
            mesh = W.make_mesh(strategy, self.runtime.num_processes, local_world, device.type)
            wrapped = W.fsdp2_wrap(self.plugin, model, strategy, mesh, device, is_main)
        else:
            wrapped = W.fsdp1_wrap(self.plugin, model, strategy, device, is_main)
        after = {_clean(name): p for name, p in wrapped.named_parameters()}
        self._param_map = {k: v for k, v in self._param_map.items() if v[0]() is not None}
        for name, old in before.items():
            new = after.get(_clean(name))
            if new is not None and new is not old:
                self._param_map[id(old)] = (weakref.ref(old), new)
        self._models.append(wrapped)
        return wrapped

    def _sharding_for(self, model: torch.nn.Module) -> str:
        """The sharding strategy for ``model``; "AUTO" is decided here from sizes and memory."""
        plugin = self.plugin
        if not plugin.is_auto_sharding:
            return plugin.resolved_sharding()
        num_params = sum(p.numel() for p in model.parameters())
        units = W.wrap_units(plugin, model)
        largest = max((sum(p.numel() for p in u.parameters()) for u in units), default=num_params)
        dtypes = plugin.mixed_precision_dtypes() or {}
        param_dtype = dtypes.get("param_dtype") or torch.float32
        choice = choose_sharding_strategy(
            num_params,
            self.runtime.num_processes,
            self._device_memory(),
            compute_bytes=torch.tensor([], dtype=param_dtype).element_size(),
            largest_unit_params=largest,
        )
        self.last_choice = choice
        if self.runtime.is_main_process:
            logger.info("FSDP sharding AUTO -> %s: %s", choice.strategy, choice.reason)
        plugin.set_sharding_strategy(choice.strategy)
        if choice.cpu_offload:
            plugin.cpu_offload = True
        return choice.strategy

    def _device_memory(self) -> int:
        """Bytes of memory one process may use: its accelerator's, or its share of the host's RAM."""
        device = self.runtime.device
        total = self.runtime.device_backend.total_memory(device.index or 0) if device.type != "cpu" else None
        if total:
            return int(total)
        try:
            import psutil

            host = int(psutil.virtual_memory().total)
        except ImportError:
            host = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        local_world = self.runtime.cluster.local_world_size or self.runtime.num_processes
        return host // max(local_world, 1)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Point ``optimizer`` at the sharded parameters of the models prepared before it.

        Raises:
            ValueError: some of its parameters belong to no prepared FSDP model, or it already holds
                state for the original (unsharded) parameters.
        """
        prepared = {id(p): p for m in self._models for p in m.parameters()}
        unmatched, changed = 0, 0
        for group in optimizer.param_groups:
            params = []
            for p in group["params"]:
                entry = self._param_map.get(id(p))
                if entry is not None and entry[0]() is p:
                    params.append(entry[1])
                    changed += 1
                elif id(p) in prepared:
                    params.append(p)
                else:
                    params.append(p)
                    unmatched += 1
            group["params"] = params
        if unmatched:
            raise ValueError(
                f"the optimizer holds {unmatched} parameter(s) of no model prepared with FSDP; FSDP replaces "
                "a model's parameters when it shards them, so pass the model to accelerator.prepare "
                "together with (or before) its optimizer"
                + (" and use use_orig_params=True with FSDP1" if self.plugin.fsdp_version == 1 else "")
            )
        if changed and optimizer.state:
            raise ValueError(
                "the optimizer already has state for the unsharded parameters; prepare it before its "
                "first step (or build it after accelerator.prepare(model))"
            )
        all_ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
        for model in self._models:
            if any(id(p) in all_ids for p in model.parameters()):
                self._optimizer_models[id(optimizer)] = model
        return optimizer

    # -------------------------------------------------------------- training
    def _no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Accumulate gradients locally: FSDP2 skips reduce-scatter (FSDP1's own ``no_sync`` is the base's)."""
        return self._sync.no_sync(model)

    def trigger_sync_in_backward(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Force backwards inside this context to reduce gradients (FSDP2; FSDP1 cannot)."""
        return self._sync.trigger_sync_in_backward(model)

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip by the norm over every shard; return that total norm (the same on every process)."""
        params = [p for p in parameters]
        ids = {id(p) for p in params}
        for model in self._models:
            if _is_fsdp1(model) and ids <= {id(p) for p in model.parameters()}:
                return model.clip_grad_norm_(max_norm, norm_type)
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
        from torch.distributed.tensor import DTensor

        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    # ------------------------------------------------------------ state dicts
    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict gathered on rank 0 (CPU); ``{}`` on other ranks. Call on every rank."""
        if not (_is_fsdp1(model) or _is_fsdp2(model)):
            return super().model_state_dict(model)
        return S.full_model_state_dict(model)

    def load_model_state_dict(
        self, model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], strict: bool = True
    ) -> object:
        """Load a full state dict (on every rank) into the sharded model."""
        if not (_is_fsdp1(model) or _is_fsdp2(model)):
            return super().load_model_state_dict(model, state_dict, strict)
        return S.load_full_model_state_dict(model, state_dict, strict)

    # ------------------------------------------------------------ checkpoints
    @property
    def sharded_checkpoints(self) -> bool:
        """Whether ``save_state`` writes per-rank shards (SHARDED_STATE_DICT)."""
        return self.plugin.state_dict_type == "SHARDED_STATE_DICT"

    def save_model_checkpoint(
        self, model: torch.nn.Module, output_dir: str, index: int, safe_serialization: bool
    ) -> bool:
        """SHARDED_STATE_DICT: write ``pytorch_model_fsdp_<index>/`` shards and return True."""
        if not self.sharded_checkpoints:
            return False
        S.save_sharded_model(model, output_dir, index)
        return True

    def load_model_checkpoint(self, model: torch.nn.Module, input_dir: str, index: int) -> bool:
        """Load shards, or a full weights file into the sharded model; True when loaded here."""
        if S.load_sharded_model(model, input_dir, index):
            return True

        path = F.find_model_file(input_dir, index)
        self.load_model_state_dict(model, F.load_model_weights(path))
        return True

    # ------------------------------------------------- checkpoints across strategies
    def checkpoint_layout(
        self, models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> dict[str, object]:
        """``"dcp"`` (SHARDED_STATE_DICT) or ``"full"`` files; optimizers keyed by parameter name."""
        return {
            "strategy": "fsdp",
            "fsdp_version": self.plugin.fsdp_version,
            "format": "dcp" if self.sharded_checkpoints else "full",
            "optimizer_keys": "name",
        }

    def reads_layout(self, layout: Mapping[str, object], saved_world: int) -> bool:
        """DCP shards (FSDP1: its own, from as many processes), and full files with name-keyed optimizers."""
        kind = layout.get("format")
        same = layout.get("fsdp_version") == 1 and saved_world == self.runtime.num_processes
        if kind == "dcp" and self.plugin.fsdp_version == 1 and not same:
            # torch 2.13's DCP load of other shards into an FSDP1 optimizer fails on 4 processes ("Missing
            # key in checkpoint state_dict: optimizer.param_groups", FSDP2's shards from 2 or 4): such
            # loads go through the full state instead.
            return False
        return kind == "dcp" or (kind == "full" and layout.get("optimizer_keys") == "name")

    def _full_shapes(self, model: torch.nn.Module) -> Mapping[str, torch.Size]:
        """The full (unsharded) shapes of a sharded model's state-dict entries."""
        return S.full_shapes(model)

    def _check_converted_optimizers(
        self, conversion: C.Conversion, models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> None:
        """Check each optimizer's saved state against the names of the model it belongs to."""
        for i, optimizer in enumerate(optimizers):
            model = self._model_for(optimizer, models[i] if i < len(models) else None)
            C.check_optimizer(
                conversion.states[i], C.optimizer_names([model], optimizer), conversion.folder, i
            )

    def apply_converted_checkpoint(
        self, models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> None:
        """Load the full portable state into the sharded models and optimizers (each rank keeps its shard)."""
        conversion, self._conversion = self._conversion, None
        assert conversion is not None, "read_converted_checkpoint read nothing"
        for model, portable in zip(models, conversion.states, strict=False):
            self.load_model_state_dict(model, portable.weights)
        for i, optimizer in enumerate(optimizers):
            optim = conversion.states[i].optimizer
            if optim is not None:
                model = self._model_for(optimizer, models[i] if i < len(models) else None)
                S.load_full_optimizer_state_dict(
                    model, getattr(optimizer, "optimizer", optimizer), cast("OptimizerStateType", optim)
                )

    def _model_for(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None) -> torch.nn.Module:
        inner = getattr(optimizer, "optimizer", optimizer)
        found = self._optimizer_models.get(id(inner))
        if found is not None:
            return found
        if model is not None:
            return model
        raise ValueError(
            "this optimizer was not prepared with an FSDP model; prepare both with accelerator.prepare"
        )

    def save_optimizer_checkpoint(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None, output_dir: str, index: int
    ) -> bool:
        """Sharded: ``optimizer_<index>/`` shards. Full: rank 0 writes the gathered state. Returns True."""
        inner = getattr(optimizer, "optimizer", optimizer)
        model = self._model_for(optimizer, model)
        if self.sharded_checkpoints:
            S.save_sharded_optimizer(model, inner, output_dir, index)
            return True

        state = S.full_optimizer_state_dict(model, inner)
        if self.runtime.is_main_process:
            F.torch_save(state, os.path.join(output_dir, F.indexed(F.OPTIMIZER_NAME, index, ".bin")))
        return True

    def load_optimizer_checkpoint(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None, input_dir: str, index: int
    ) -> bool:
        """Load what ``save_optimizer_checkpoint`` wrote (either layout); True when loaded here."""
        inner = getattr(optimizer, "optimizer", optimizer)
        model = self._model_for(optimizer, model)
        if S.load_sharded_optimizer(model, inner, input_dir, index):
            return True

        path = os.path.join(input_dir, F.indexed(F.OPTIMIZER_NAME, index, ".bin"))
        S.load_full_optimizer_state_dict(model, inner, F.torch_load(path, "cpu"))
        return True


def _one_process_group(runtime: Runtime) -> None:
    """Start the one-process group FSDP needs in a job of one process (no-op when one exists); its
    store lives in memory, so no port is opened. It is torn down at exit like any other group.
    """
    if torch.distributed.is_initialized():
        return
    cluster = runtime.cluster
    process_group.start(
        device=runtime.device,
        default_backend=runtime.device_backend.dist_backend,
        main_address=cluster.main_address,
        main_port=cluster.main_port,
        rank=0,
        world_size=1,
        attempt=cluster.restart_count,
    )
