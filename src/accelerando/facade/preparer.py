"""The preparer: turns the user's models, optimizers, dataloaders and schedulers into prepared ones.

``Accelerator.prepare`` and its ``prepare_*`` siblings delegate here. The preparer asks the strategy
to wrap (``prepare_all``, else one object at a time), the precision to convert, and registers the
results in the :class:`~accelerando.facade.registry.PreparedObjects` it was given; it makes no
backend decision itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import torch

from accelerando.backends.strategies.base import ManagesPrecision, Prepared, PrepareRequest
from accelerando.core.settings import environment_setting
from accelerando.facade.context import ServiceContext
from accelerando.optimizer import AcceleratedOptimizer
from accelerando.plugins.dynamo import TorchDynamoPlugin
from accelerando.scheduler import AcceleratedScheduler

__all__ = ["Preparer", "kind_of", "mark_prepared", "verify_device_map"]

# Settings a strategy may fix in ``Prepared.fixed_settings``.
_FIXABLE_SETTINGS = frozenset({"gradient_accumulation_steps"})

_DATALOADER = "dataloader"
_SCHEDULER = "scheduler"


def kind_of(obj: object) -> object:
    """What ``prepare`` sees in ``obj``: ``nn.Module``, ``Optimizer``, "dataloader", "scheduler" or None."""
    if isinstance(obj, torch.nn.Module):
        return torch.nn.Module
    if isinstance(obj, torch.optim.Optimizer):
        return torch.optim.Optimizer
    if isinstance(obj, torch.utils.data.DataLoader) or hasattr(obj, "total_batch_size"):
        return _DATALOADER
    if isinstance(obj, (torch.optim.lr_scheduler.LRScheduler, AcceleratedScheduler)) or (
        hasattr(obj, "step") and hasattr(obj, "optimizer") and hasattr(obj, "get_last_lr")
    ):
        return _SCHEDULER
    return None


def mark_prepared(objects: Sequence[object]) -> None:
    """Flag each prepared model, optimizer, dataloader and scheduler as the reference does.

    Code written for the reference (and transformers) reads ``obj._is_accelerate_prepared``; other
    objects passed through ``prepare`` (None, lists...) are left alone.
    """
    for obj in objects:
        if obj is not None and kind_of(obj) is not None:
            try:
                obj._is_accelerate_prepared = True  # type: ignore[attr-defined]
            except AttributeError:  # an object without an instance dict (slots): nothing to flag
                pass


def verify_device_map(model: torch.nn.Module) -> bool:
    """True when ``model`` (or a submodule) was dispatched over several devices with a device map."""
    for module in model.modules():
        device_map = getattr(module, "hf_device_map", None)
        if device_map is not None and len(set(device_map.values())) > 1:
            return True
    return False


class Preparer:
    """Prepares objects for one Accelerator and registers them.

    Args:
        context: the Accelerator's shared services record: the registry where prepared objects are
            registered, the strategy that wraps models and optimizers, the precision that converts
            models, the process view, the accumulation state (a strategy may fix its steps), the
            shared options and the Runtime (mesh, plugins: ``dynamo`` compiles prepared models).
        quantized_offload_on_cpu: whether bitsandbytes can run an 8/4-bit model offloaded to the CPU.

    Attributes:
        after_first_prepare: called once, after the first ``prepare()`` registered its objects
            (automatic resume), or None.
    """

    def __init__(self, context: ServiceContext, quantized_offload_on_cpu: Callable[[], bool]) -> None:
        self.context = context
        self.registry = context.registry
        self.strategy = context.strategy
        self.precision = context.precision
        self.state = context.state
        self.gradient_state = context.gradient_state
        self.options = context.options
        self.dynamo_plugin: TorchDynamoPlugin = context.runtime.plugins.dynamo
        self.quantized_offload_on_cpu = quantized_offload_on_cpu
        self.after_first_prepare: Callable[[], object] | None = None

    def prepare(self, *args: object, device_placement: Sequence[bool | None] | None = None) -> object:
        """Prepare models, optimizers, dataloaders and schedulers, in any mix and order.

        Returns the prepared objects in the order given (one object when one was passed). An object
        that was already prepared comes back unchanged. Models are prepared first (some strategies
        need them wrapped before their optimizers), then optimizers, dataloaders, schedulers.

        Raises:
            ValueError: ``device_placement`` has the wrong length.
        """
        placements: Sequence[bool | None] = (
            [None] * len(args) if device_placement is None else device_placement
        )
        if len(placements) != len(args):
            raise ValueError(
                f"device_placement has {len(placements)} entries for {len(args)} objects; give one per object"
            )
        if not isinstance(self.strategy, ManagesPrecision):
            # MS-AMP converts a model together with its optimizer, before any wrapping (DDP); an engine
            # strategy (DeepSpeed) does it inside its engine, from its config, instead.
            default = self.options.device_placement
            placement = [default if p is None else bool(p) for p in placements]
            args = tuple(
                self.precision.prepare_objects(args, placement, self.state.device, self.registry.holds)
            )
        request = PrepareRequest(
            objects=tuple(args),
            device_placement=tuple(placements),
            gradient_accumulation_steps=self.gradient_state.num_steps,
            split_batches=bool(self.options.dataloader_config.split_batches),
            prepare_data_loader=self.prepare_data_loader,
            is_prepared=self.registry.holds,
        )
        prepared = self.strategy.prepare_all(request)
        if prepared is not None:
            self._register(prepared)
            result = prepared.objects
        else:
            result = list(args)
            for kind in (torch.nn.Module, torch.optim.Optimizer, _DATALOADER, _SCHEDULER):
                for i, obj in enumerate(args):
                    if kind_of(obj) == kind:
                        result[i] = self._prepare_one(obj, placements[i])
        mark_prepared(result)
        hook, self.after_first_prepare = self.after_first_prepare, None
        if hook is not None:
            hook()
        return result[0] if len(result) == 1 else tuple(result)

    def _register(self, prepared: Prepared) -> None:
        """Register what a strategy's ``prepare_all`` made: the strategy never writes into the facade.

        Raises:
            ValueError: a fixed setting the facade does not know (a strategy bug).
        """
        self.registry.add(prepared)
        for name, value in prepared.fixed_settings.items():
            if name not in _FIXABLE_SETTINGS:
                raise ValueError(
                    f"the strategy fixed {name}={value!r}, which the Accelerator cannot take; known: "
                    f"{sorted(_FIXABLE_SETTINGS)}"
                )
            self.gradient_state.num_steps = int(value)

    def _prepare_one(self, obj: object, device_placement: bool | None) -> object:
        if isinstance(obj, torch.nn.Module):
            return self.prepare_model(obj, device_placement=device_placement)
        if isinstance(obj, torch.optim.Optimizer):
            return self.prepare_optimizer(obj, device_placement=device_placement)
        kind = kind_of(obj)
        if kind == _DATALOADER:
            return self.prepare_data_loader(
                cast("torch.utils.data.DataLoader", obj), device_placement=device_placement
            )
        if kind == _SCHEDULER:
            return self.prepare_scheduler(obj)
        return obj

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Prepare one model: precision conversion, then the strategy's wrap, then compilation.

        The order matters: autocast must wrap the user's forward (inside DDP/FSDP), and
        ``torch.compile`` must see the final wrapped module.

        Raises:
            ValueError: in a distributed run, a model dispatched over several devices with a
                ``device_map`` (unless the ``bypass_device_map`` setting,
                ``ACCELERATE_BYPASS_DEVICE_MAP``, is true); an 8/4-bit model offloaded where
                bitsandbytes cannot train it.

        Example:
            >>> model = accelerator.prepare_model(torch.nn.Linear(4, 2))
        """
        models = self.registry.models
        if any(model is m for m in models):
            return model
        self._refuse_spread_model(model)
        self._refuse_quantized_offload(model)
        if device_placement is None:
            device_placement = self.options.device_placement
        if any(getattr(m, "hf_device_map", None) is not None for m in model.modules()):
            # A dispatched model (device map, offload hooks) already sits where it must run;
            # moving it would undo the dispatch.
            device_placement = False
        models.append(model)
        model = self.precision.convert_module(model)
        model = self.strategy.prepare_model(
            model, device_placement=device_placement, evaluation_mode=evaluation_mode
        )
        if self.dynamo_plugin.enabled:
            # regional compilation when the plugin asks for it, else torch.compile of the whole model
            model = self.dynamo_plugin.compile(model, self.context.runtime.distributed_type)
        models[-1] = model
        return model

    def _refuse_spread_model(self, model: torch.nn.Module) -> None:
        """Refuse a model spread over several devices when several processes would train it."""
        if self.state.num_processes <= 1 or not verify_device_map(model):
            return
        if environment_setting("bypass_device_map"):
            return
        raise ValueError(
            "this model was dispatched over several devices with a device_map (e.g. device_map='auto'), "
            "which cannot be trained in a distributed run: launch a single process (--num_processes=1 or "
            "plain `python script.py`), load the model without a device_map, or set "
            "ACCELERATE_BYPASS_DEVICE_MAP=true if you know the layout is right"
        )

    def _refuse_quantized_offload(self, model: torch.nn.Module) -> None:
        """Refuse to train an 8-bit / 4-bit model with parts offloaded to the CPU or disk.

        Raises:
            ValueError: the model was loaded in 8 or 4 bits and its ``hf_device_map`` places modules on
                ``"disk"``, or on ``"cpu"`` without a bitsandbytes build that runs on the CPU.
        """
        if not (getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False)):
            return
        places = {str(place) for place in (getattr(model, "hf_device_map", None) or {}).values()}
        if "disk" in places or ("cpu" in places and not self.quantized_offload_on_cpu()):
            raise ValueError(
                "You can't train a model that has been loaded in 8-bit or 4-bit precision with CPU or disk "
                "offload. If you want train the 8-bit or 4-bit model in CPU, please install bitsandbytes with "
                "multi-backend, see https://huggingface.co/docs/bitsandbytes/main/en/installation#multi-backend"
            )

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> AcceleratedOptimizer:
        """Wrap ``optimizer`` in an ``AcceleratedOptimizer`` (once; a prepared one comes back as is).

        Example:
            >>> optimizer = accelerator.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        """
        if isinstance(optimizer, AcceleratedOptimizer):
            return optimizer
        for prepared in self.registry.optimizers:
            if prepared.optimizer is optimizer:
                return prepared
        if device_placement is None:
            device_placement = self.options.device_placement
        optimizer = self.strategy.prepare_optimizer(optimizer)
        scaler = self.precision.scaler
        wrapped = AcceleratedOptimizer(
            optimizer,
            device_placement=device_placement,
            scaler=scaler,
            # In fp32 the precision plugin's step is the plain step: skip the indirection on the hot path.
            precision=self.precision if scaler is not None else None,
            device=self.state.device,
        )
        wrapped._after_step = self.registry.after_optimizer_step
        self.registry.optimizers.append(wrapped)
        return wrapped

    def prepare_scheduler(self, scheduler: object) -> AcceleratedScheduler:
        """Wrap ``scheduler`` so it steps with the real optimizer steps.

        Example:
            >>> scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
            >>> scheduler = accelerator.prepare_scheduler(scheduler)
        """
        if isinstance(scheduler, AcceleratedScheduler):
            return scheduler
        for prepared in self.registry.schedulers:
            if prepared.scheduler is scheduler:
                return prepared
        target = getattr(scheduler, "optimizer", None)
        optimizers = [opt for opt in self.registry.optimizers if opt.optimizer is target or opt is target]
        wrapped = AcceleratedScheduler(
            scheduler,
            optimizers or self.registry.optimizers,
            step_with_optimizer=self.options.step_scheduler_with_optimizer,
            split_batches=bool(self.options.dataloader_config.split_batches),
            # One step per data-parallel group: tensor/context-parallel ranks read the same batch.
            num_processes=self._data_parallel_processes(),
        )
        self.registry.schedulers.append(wrapped)
        return wrapped

    def _data_parallel_processes(self) -> int:
        """How many processes read different batches (all of them without a ParallelismConfig)."""
        mesh = self.context.mesh
        if mesh is None:
            return self.state.num_processes
        config = self.context.runtime.plugins.parallelism_config
        if config is not None:
            return int(config.data_parallel_size)
        from accelerando.data_loader.prepare import _data_parallel_layout

        return _data_parallel_layout(self.state.num_processes, 0, mesh)[0]  # a strategy's own mesh (pipeline)

    def prepare_data_loader(
        self,
        data_loader: torch.utils.data.DataLoader,
        device_placement: bool | None = None,
        slice_fn_for_dispatch: Callable[..., object] | None = None,
    ) -> object:
        """Shard ``data_loader`` across processes and move its batches to the device.

        Example:
            >>> from torch.utils.data import DataLoader
            >>> loader = accelerator.prepare_data_loader(DataLoader(list(range(8)), batch_size=2))
            >>> len(loader)  # batches per process: 2 on 2 processes
            4
        """
        dataloaders = self.registry.dataloaders
        if any(data_loader is d for d in dataloaders):
            return data_loader
        from accelerando.data_loader import prepare_data_loader

        if device_placement is None:
            device_placement = self.options.device_placement
        cfg = self.options.dataloader_config
        prepared = prepare_data_loader(
            data_loader,
            device=self.state.device,
            num_processes=self.state.num_processes,
            process_index=self.state.process_index,
            split_batches=cfg.split_batches,
            put_on_device=device_placement,
            rng_types=list(self.options.rng_types),
            dispatch_batches=cfg.dispatch_batches,
            even_batches=cfg.even_batches,
            slice_fn_for_dispatch=slice_fn_for_dispatch,
            use_seedable_sampler=cfg.use_seedable_sampler,
            data_seed=cfg.data_seed,
            non_blocking=cfg.non_blocking,
            use_stateful_dataloader=cfg.use_stateful_dataloader,
            # With tensor/context/pipeline axes, the ranks that differ only along them read the same
            # batches (every stage of a pipeline sees the same batch).
            torch_device_mesh=self.context.mesh,
        )
        dataloaders.append(prepared)
        return prepared
