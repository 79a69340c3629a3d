"""Accelerator methods that prepare models, optimizers, dataloaders and schedulers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from accelerando.optimizer import AcceleratedOptimizer
from accelerando.scheduler import AcceleratedScheduler
from accelerando.strategies.base import Prepared, PrepareRequest

__all__ = ["PreparingMixin"]

# Settings a strategy may fix in ``Prepared.fixed_settings``, each set through the Accelerator's
# property of the same name.
_FIXABLE_SETTINGS = frozenset({"gradient_accumulation_steps"})


class PreparingMixin:
    """prepare / prepare_model / prepare_optimizer / prepare_scheduler / prepare_data_loader."""

    _strategy: Any
    _precision: Any
    _models: list[Any]
    _optimizers: list[Any]
    _schedulers: list[Any]
    _dataloaders: list[Any]
    dynamo_plugin: Any
    dataloader_config: Any
    device_placement: bool
    rng_types: list[str]
    step_scheduler_with_optimizer: bool
    scaler: Any
    deepspeed_engine_wrapped: Any
    gradient_accumulation_steps: int
    split_batches: bool
    distributed_type: Any
    verify_device_map: Callable[[torch.nn.Module], bool]
    _refuse_quantized_offload: Callable[[torch.nn.Module], None]

    def prepare(self, *args: Any, device_placement: list[bool | None] | None = None) -> Any:
        """Prepare models, optimizers, dataloaders and schedulers, in any mix and order.

        Returns the prepared objects in the order given (one object when one was passed). An object
        that was already prepared comes back unchanged. Models are prepared first (some strategies
        need them wrapped before their optimizers), then optimizers, dataloaders, schedulers.

        Raises:
            ValueError: ``device_placement`` has the wrong length.
        """
        if device_placement is None:
            device_placement = [None] * len(args)
        elif len(device_placement) != len(args):
            raise ValueError(
                f"device_placement has {len(device_placement)} entries for {len(args)} objects; give one per object"
            )
        if not self._strategy.manages_precision:
            # MS-AMP converts a model together with its optimizer, before any wrapping (DDP); an engine
            # strategy (DeepSpeed) does it inside its engine, from its config, instead.
            placement = [self.device_placement if p is None else bool(p) for p in device_placement]
            args = tuple(self._precision.prepare_objects(args, placement, self.device, self._is_registered))
        request = PrepareRequest(
            objects=tuple(args),
            device_placement=tuple(device_placement),
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            split_batches=self.split_batches,
            prepare_data_loader=self.prepare_data_loader,
            is_prepared=self._is_registered,
        )
        prepared = self._strategy.prepare_all(request)
        if prepared is not None:
            self._register_prepared(prepared)
            grouped = prepared.objects
            _mark_prepared(grouped)
            self._resume_if_asked()
            return grouped[0] if len(grouped) == 1 else tuple(grouped)
        result = list(args)
        order = (torch.nn.Module, torch.optim.Optimizer, "dataloader", "scheduler")
        for kind in order:
            for i, obj in enumerate(args):
                if self._kind_of(obj) == kind:
                    result[i] = self._prepare_one(obj, device_placement[i])
        _mark_prepared(result)
        self._resume_if_asked()
        return result[0] if len(result) == 1 else tuple(result)

    def _resume_if_asked(self) -> None:
        """With ``auto_resume``, the first ``prepare()`` loads the newest checkpoint (see facade.resume)."""
        if getattr(self, "_auto_resume_pending", False):
            self._auto_resume_pending = False
            from accelerando.facade.resume import resume_on_prepare

            resume_on_prepare(self)

    def _is_registered(self, obj: Any) -> bool:
        """Whether ``obj`` is one of the models, optimizers or schedulers this Accelerator prepared."""
        return any(obj is p for p in (*self._models, *self._optimizers, *self._schedulers))

    def _register_prepared(self, prepared: Prepared) -> None:
        """Register what a strategy's ``prepare_all`` made: the strategy never writes into the facade.

        Models, optimizers and schedulers join the prepared lists (``save_state``, ``free_memory``...
        see them); ``engine`` becomes ``deepspeed_engine_wrapped``; each fixed setting is applied
        through the Accelerator's own property (``gradient_accumulation_steps`` -> the gradient state).

        Raises:
            ValueError: a fixed setting the facade does not know (a strategy bug).
        """
        self._models.extend(prepared.models)
        self._optimizers.extend(prepared.optimizers)
        self._schedulers.extend(prepared.schedulers)
        if prepared.engine is not None:
            self.deepspeed_engine_wrapped = prepared.engine
        for name, value in prepared.fixed_settings.items():
            if name not in _FIXABLE_SETTINGS:
                raise ValueError(
                    f"the strategy fixed {name}={value!r}, which the Accelerator cannot take; known: "
                    f"{sorted(_FIXABLE_SETTINGS)}"
                )
            setattr(self, name, value)

    @staticmethod
    def _kind_of(obj: Any) -> Any:
        if isinstance(obj, torch.nn.Module):
            return torch.nn.Module
        if isinstance(obj, torch.optim.Optimizer):
            return torch.optim.Optimizer
        if isinstance(obj, torch.utils.data.DataLoader) or hasattr(obj, "total_batch_size"):
            return "dataloader"
        if isinstance(obj, (torch.optim.lr_scheduler.LRScheduler, AcceleratedScheduler)) or (
            hasattr(obj, "step") and hasattr(obj, "optimizer") and hasattr(obj, "get_last_lr")
        ):
            return "scheduler"
        return None

    def _prepare_one(self, obj: Any, device_placement: bool | None) -> Any:
        kind = self._kind_of(obj)
        if kind is torch.nn.Module:
            return self.prepare_model(obj, device_placement=device_placement)
        if kind is torch.optim.Optimizer:
            return self.prepare_optimizer(obj, device_placement=device_placement)
        if kind == "dataloader":
            return self.prepare_data_loader(obj, device_placement=device_placement)
        if kind == "scheduler":
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
                ``ACCELERATE_BYPASS_DEVICE_MAP``, is true).
        """
        if any(model is m for m in self._models):
            return model
        self._refuse_spread_model(model)
        self._refuse_quantized_offload(model)
        if device_placement is None:
            device_placement = self.device_placement
        if any(getattr(m, "hf_device_map", None) is not None for m in model.modules()):
            # A dispatched model (device map, offload hooks) already sits where it must run;
            # moving it would undo the dispatch.
            device_placement = False
        self._models.append(model)
        model = self._precision.convert_module(model)
        model = self._strategy.prepare_model(
            model, device_placement=device_placement, evaluation_mode=evaluation_mode
        )
        if self.dynamo_plugin.enabled:
            # regional compilation when the plugin asks for it, else torch.compile of the whole model
            model = self.dynamo_plugin.compile(model, self.distributed_type)
        self._models[-1] = model
        return model

    def _refuse_spread_model(self, model: torch.nn.Module) -> None:
        """Refuse a model spread over several devices when several processes would train it."""
        from accelerando.settings import environment_setting

        if self.num_processes <= 1 or not self.verify_device_map(model):
            return
        if environment_setting("bypass_device_map"):
            return
        raise ValueError(
            "this model was dispatched over several devices with a device_map (e.g. device_map='auto'), "
            "which cannot be trained in a distributed run: launch a single process (--num_processes=1 or "
            "plain `python script.py`), load the model without a device_map, or set "
            "ACCELERATE_BYPASS_DEVICE_MAP=true if you know the layout is right"
        )

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> Any:
        """Wrap ``optimizer`` in an ``AcceleratedOptimizer`` (once; a prepared one comes back as is)."""
        if isinstance(optimizer, AcceleratedOptimizer):
            return optimizer
        for prepared in self._optimizers:
            if prepared.optimizer is optimizer:
                return prepared
        if device_placement is None:
            device_placement = self.device_placement
        optimizer = self._strategy.prepare_optimizer(optimizer)
        # In fp32 the precision plugin's step is the plain step: skip the indirection on the hot path.
        precision = self._precision if self._precision.scaler is not None else None
        wrapped = AcceleratedOptimizer(
            optimizer,
            device_placement=device_placement,
            scaler=self.scaler,
            precision=precision,
            device=self.device,
        )
        monitor = getattr(self, "_memory_monitor", None)
        if monitor is not None:
            wrapped._after_step = monitor.step
        self._optimizers.append(wrapped)
        return wrapped

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Wrap ``scheduler`` so it steps with the real optimizer steps."""
        if isinstance(scheduler, AcceleratedScheduler):
            return scheduler
        for prepared in self._schedulers:
            if prepared.scheduler is scheduler:
                return prepared
        target = getattr(scheduler, "optimizer", None)
        optimizers = [opt for opt in self._optimizers if opt.optimizer is target or opt is target]
        wrapped = AcceleratedScheduler(
            scheduler,
            optimizers or self._optimizers,
            step_with_optimizer=self.step_scheduler_with_optimizer,
            split_batches=self.split_batches,
            # One step per data-parallel group: tensor/context-parallel ranks read the same batch.
            num_processes=self._data_parallel_processes(),
        )
        self._schedulers.append(wrapped)
        return wrapped

    def _data_parallel_processes(self) -> int:
        """How many processes read different batches (all of them without a ParallelismConfig)."""
        mesh = self.state.device_mesh
        if mesh is None:
            return self.num_processes
        config = self.state.parallelism_config
        if config is not None:
            return int(config.data_parallel_size)
        from accelerando.data_loader.prepare import _data_parallel_layout

        return _data_parallel_layout(self.num_processes, 0, mesh)[0]  # a strategy's own mesh (pipeline)

    def prepare_data_loader(
        self,
        data_loader: Any,
        device_placement: bool | None = None,
        slice_fn_for_dispatch: Callable | None = None,
    ) -> Any:
        """Shard ``data_loader`` across processes and move its batches to the device."""
        if any(data_loader is d for d in self._dataloaders):
            return data_loader
        from accelerando.data_loader import prepare_data_loader

        if device_placement is None:
            device_placement = self.device_placement
        cfg = self.dataloader_config
        prepared = prepare_data_loader(
            data_loader,
            device=self.device,
            num_processes=self.num_processes,
            process_index=self.process_index,
            split_batches=cfg.split_batches,
            put_on_device=device_placement,
            rng_types=list(self.rng_types),
            dispatch_batches=cfg.dispatch_batches,
            even_batches=cfg.even_batches,
            slice_fn_for_dispatch=slice_fn_for_dispatch,
            use_seedable_sampler=cfg.use_seedable_sampler,
            data_seed=cfg.data_seed,
            non_blocking=cfg.non_blocking,
            use_stateful_dataloader=cfg.use_stateful_dataloader,
            # With tensor/context/pipeline axes, the ranks that differ only along them read the same
            # batches (every stage of a pipeline sees the same batch).
            torch_device_mesh=self.state.device_mesh,
        )
        self._dataloaders.append(prepared)
        return prepared

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """Return a loader that starts ``num_batches`` batches into ``dataloader`` (O(1) for map-style data)."""
        from accelerando.data_loader import skip_first_batches

        return skip_first_batches(dataloader, num_batches=num_batches)


def _mark_prepared(objects: Any) -> None:
    """Flag each prepared model, optimizer, dataloader and scheduler as the reference does.

    Code written for the reference (and transformers) reads ``obj._is_accelerate_prepared``; other
    objects passed through ``prepare`` (None, lists...) are left alone.
    """
    for obj in objects:
        if obj is not None and PreparingMixin._kind_of(obj) is not None:
            try:
                obj._is_accelerate_prepared = True
            except AttributeError:  # an object without an instance dict (slots): nothing to flag
                pass
