"""DeepSpeed: ZeRO stages 0-3 and offload, through one engine per trained model.

``prepare_all`` sees the model, optimizer, scheduler and dataloaders of one ``prepare`` call
together, resolves the plugin's config ("auto" values) from them, and builds the engine with
``deepspeed.initialize``. ``deepspeed`` is imported here only, when this strategy is used.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, TypeGuard

import torch

import accelerando.backends.strategies.conversion as C
from accelerando.backends.precision.base import Precision
from accelerando.backends.strategies.base import (
    ManagesPrecision,
    Prepared,
    PrepareRequest,
    ScalesLossForAccumulation,
    Strategy,
)
from accelerando.backends.strategies.conversion import CheckpointConversionError
from accelerando.backends.strategies.deepspeed.auto_stage import ZeroChoice
from accelerando.backends.strategies.deepspeed.config import get_value
from accelerando.backends.strategies.deepspeed.convert import apply_deepspeed
from accelerando.backends.strategies.deepspeed.msamp import (
    converts_in_engine,
    engine_initializer,
    msamp_opt_level,
)
from accelerando.backends.strategies.deepspeed.resolve import PrepareInputs, resolve_config
from accelerando.backends.strategies.deepspeed.selection import active_plugin
from accelerando.backends.strategies.deepspeed.ulysses import ulysses_dataloader
from accelerando.backends.strategies.deepspeed.wrappers import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
)
from accelerando.checkpointing import files as F
from accelerando.checkpointing.target import LoadsOwnCheckpoints
from accelerando.core.enums import DistributedType
from accelerando.core.gradient_state import GradientState
from accelerando.core.runtime import Runtime
from accelerando.plugins.deepspeed import DeepSpeedPlugin, import_deepspeed

if TYPE_CHECKING:
    from deepspeed.runtime.engine import DeepSpeedEngine
    from torch.serialization import MAP_LOCATION

__all__ = ["DeepSpeedStrategy"]

logger = logging.getLogger(__name__)


def _is_engine(obj: object) -> TypeGuard[DeepSpeedEngine]:
    return type(obj).__name__ == "DeepSpeedEngine" or hasattr(obj, "zero_optimization_stage")


# Checkpoint engines whose load is a plain torch.load of the path (DeepSpeed 0.19).
_PLAIN_LOAD_ENGINES = ("TorchCheckpointEngine", "FastCheckpointEngine", "DecoupledCheckpointEngine")
# The DeepSpeed classes engine checkpoints hold (ZeRO 1-3, fp32/bf16/fp16): plain data classes and
# an enum, whose rebuilding runs no code of the file's choosing.
_DEEPSPEED_SAFE_TYPES = (
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
)


def _refuse_full_unpickling(engine: object, folder: str) -> None:
    """Refuse, without the caller's opt-in, a DeepSpeed load that DeepSpeed would unpickle fully itself.

    Two such loads cannot be made weights-only from outside DeepSpeed: a checkpoint engine whose
    ``load`` is not a plain ``torch.load`` of a path (Nebula, DataStates, ...), and a universal
    checkpoint (``"checkpoint": {"load_universal": true}``), whose per-parameter files DeepSpeed reads
    with ``torch.load(weights_only=False)``.

    Raises:
        UnsafeCheckpointError: Naming the folder, what DeepSpeed would unpickle and the opt-in.
    """
    if not F.weights_only_default():
        return
    checkpoint_engine = getattr(engine, "checkpoint_engine", None)
    name = type(checkpoint_engine).__name__
    universal = getattr(engine, "load_universal_checkpoint", None)
    if checkpoint_engine is not None and name not in _PLAIN_LOAD_ENGINES:
        what = f"DeepSpeed's {name} checkpoint engine, which unpickles every file fully"
    elif callable(universal) and universal():
        what = "a DeepSpeed universal checkpoint, whose files DeepSpeed unpickles fully (load_hp_checkpoint_state)"
    else:
        return
    error = F.UnsafeCheckpointError(folder, what)
    error.args = (
        f"Refused to load {folder!r} through {what}: unpickling can run code hidden in the files, and "
        f"accelerando cannot make that read weights-only. If you trust this checkpoint, pass {F.OPT_IN} "
        "to load_state.",
    )
    raise error


@contextlib.contextmanager
def _weights_only_engine_loads(engine: object) -> Iterator[None]:
    """Within the block, the engine's checkpoint engine reads files weights-only (see load_model_checkpoint)."""
    import importlib

    checkpoint_engine = getattr(engine, "checkpoint_engine", None)
    if checkpoint_engine is None or type(checkpoint_engine).__name__ not in _PLAIN_LOAD_ENGINES:
        yield
        return
    safe = []
    for module, name in _DEEPSPEED_SAFE_TYPES:
        with contextlib.suppress(ImportError, AttributeError):
            safe.append(getattr(importlib.import_module(module), name))

    def load(path: str, map_location: MAP_LOCATION = None) -> object:
        with torch.serialization.safe_globals(safe):
            return F.torch_load(path, map_location)

    checkpoint_engine.load = load  # an instance attribute: hides the class's method
    try:
        yield
    finally:
        del checkpoint_engine.load


def _check_scalars(optimizer: Mapping[str, object], folder: str) -> None:
    """DeepSpeed keeps one step counter per partition: refuse saved per-parameter counters that differ.

    Raises:
        CheckpointConversionError: Naming the counter that differs between parameters.
    """
    state = optimizer.get("state")
    seen: dict[str, float] = {}
    for entry in state.values() if isinstance(state, dict) else []:
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() == 0:
                if seen.setdefault(key, float(value)) != float(value):
                    raise CheckpointConversionError(
                        f"{folder!r}: the saved optimizer's {key!r} differs between parameters and DeepSpeed "
                        "keeps one per partition; load it under the strategy that saved it."
                    )


def _kind(obj: object) -> str | None:
    if isinstance(obj, torch.nn.Module):
        return "model"
    if isinstance(obj, (torch.optim.Optimizer, DummyOptim)):
        return "optimizer"
    if isinstance(obj, (DummyScheduler, torch.optim.lr_scheduler.LRScheduler)) or (
        hasattr(obj, "step") and hasattr(obj, "optimizer") and hasattr(obj, "get_last_lr")
    ):
        return "scheduler"
    if _is_dataloader(obj):
        return "dataloader"
    return None


def _is_dataloader(obj: object) -> TypeGuard[torch.utils.data.DataLoader[object]]:
    """Whether the facade prepares ``obj`` as a dataloader (a DataLoader, or a loader with ``total_batch_size``)."""
    return isinstance(obj, torch.utils.data.DataLoader) or hasattr(obj, "total_batch_size")


def _batch_size_per_process(loader: object, num_processes: int, split_batches: bool) -> int | None:
    size = getattr(loader, "batch_size", None)
    if size is None:
        size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    if size is None:
        return None
    return int(size) // num_processes if split_batches else int(size)


def _mark_moe_leaves(plugin: DeepSpeedPlugin, model: torch.nn.Module, config: Mapping[str, object]) -> None:
    """Under ZeRO-3, make the plugin's ``transformer_moe_cls_names`` layers of ``model`` ZeRO-3 leaves.

    Other stages keep whole parameters on every rank, so there is nothing to gather per layer.

    Raises:
        ValueError: a class name matches no submodule of ``model``.
    """
    zero = config.get("zero_optimization", {})
    stage = zero.get("stage") if isinstance(zero, Mapping) else None
    if plugin.transformer_moe_cls_names and str(stage) == "3":
        plugin.set_moe_leaf_modules(model)


class DeepSpeedStrategy(ManagesPrecision, ScalesLossForAccumulation, LoadsOwnCheckpoints, Strategy):
    """Wrap each prepared model (with its optimizer and scheduler) in a DeepSpeed engine.

    The engine divides the loss for accumulation, reduces gradients, clips (``gradient_clipping``
    in the config) and steps; the Accelerator's ``backward`` hands the loss over undivided.
    """

    distributed_type = DistributedType.DEEPSPEED
    name = "deepspeed"

    def __init__(self, runtime: Runtime, precision: Precision, **options: object) -> None:
        super().__init__(runtime, precision, **options)
        self.engines: list[DeepSpeedEngine] = []
        self.engine_wrapper: DeepSpeedEngineWrapper | None = None
        self.auto_choice: ZeroChoice | None = None
        self._batch_sizes: list[int] = []
        self._warned_clip = False
        # The connector gives the runtime a plugin made from the launcher's settings when the script
        # passed none (--use_deepspeed alone), so one is always active here.
        self._active_plugin().set_deepspeed_weakref()

    def _active_plugin(self) -> DeepSpeedPlugin:
        """The DeepSpeed plugin selected now (``accelerator.state.select_deepspeed_plugin``)."""
        return active_plugin(self.runtime.plugins.deepspeed)

    # ------------------------------------------------------------------ prepare
    def prepare_all(self, request: PrepareRequest) -> Prepared:
        """Build one engine from the model, optimizer and scheduler of this ``prepare`` call.

        Dataloaders are prepared by the facade's ``request.prepare_data_loader`` first (their batch
        size fills the config). Objects already prepared come back unchanged. The returned record
        names the engine, its optimizer and scheduler wrappers for the facade to register, and the
        accumulation steps the config fixed.

        Raises:
            ImportError: DeepSpeed is not installed.
            ValueError: several models, or an optimizer/scheduler without its model, in one call;
                config problems (see ``resolve_config``).
        """
        import_deepspeed()
        objects = request.objects
        prepared = Prepared(objects=list(objects))
        found: dict[str, list[int]] = {"model": [], "optimizer": [], "scheduler": []}
        for i, obj in enumerate(objects):
            kind = _kind(obj)
            if kind == "dataloader" and _is_dataloader(obj):
                self._note_batch_size(obj, request.split_batches)
                prepared.objects[i] = request.prepare_data_loader(obj, request.device_placement[i])
            elif kind in found and not request.is_prepared(obj):
                found[kind].append(i)
        if not found["model"]:
            if found["optimizer"] or found["scheduler"]:
                raise ValueError(
                    "under DeepSpeed, pass the model together with its optimizer and scheduler to one "
                    "accelerator.prepare(...) call"
                )
            return prepared
        for kind, where in found.items():
            if len(where) > 1:
                raise ValueError(
                    f"DeepSpeed builds one engine per prepare() call, which got {len(where)} {kind}s; "
                    "prepare each model (with its optimizer and scheduler) in its own call"
                )
        pick: dict[str, object] = {k: (objects[v[0]] if v else None) for k, v in found.items()}
        model = pick["model"]
        assert isinstance(model, torch.nn.Module), "_kind found a model"  # found["model"] is not empty
        # Autocast around the user's forward (the engine holds low-precision weights; the inputs
        # the script passes stay fp32), exactly as for the other strategies.
        # Except MS-AMP, which converts the model with its optimizer inside its engine wrapper.
        plugin = self._active_plugin()
        if not converts_in_engine(self.precision, plugin.deepspeed_config):
            model = self.precision.convert_module(model)
        optimizer = pick["optimizer"]
        assert optimizer is None or isinstance(optimizer, (torch.optim.Optimizer, DummyOptim)), "see _kind"
        self._build_engine(prepared, request, model, optimizer, pick["scheduler"])
        made = {"model": prepared.models, "optimizer": prepared.optimizers, "scheduler": prepared.schedulers}
        for kind, where in found.items():
            if where:
                prepared.objects[where[0]] = made[kind][0] if made[kind] else None
        return prepared

    def _note_batch_size(self, loader: object, split_batches: bool) -> None:
        size = _batch_size_per_process(loader, self.runtime.num_processes, split_batches)
        if size is not None:
            self._batch_sizes.append(size)

    def _build_engine(
        self,
        prepared: Prepared,
        request: PrepareRequest,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | DummyOptim | None,
        scheduler: object,
    ) -> None:
        plugin = self._active_plugin()
        num_processes = self.runtime.num_processes
        inputs = PrepareInputs(
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            batch_sizes=list(self._batch_sizes),
            num_processes=num_processes,
            gradient_accumulation_steps=request.gradient_accumulation_steps,
            mixed_precision=self.runtime.mixed_precision,
            device=self.runtime.device,
            device_backend=self.runtime.device_backend,
            is_train_batch_min=bool(plugin.is_train_batch_min),
            local_processes=max(1, num_processes // max(self.runtime.num_nodes, 1)),
            msamp_opt_level=msamp_opt_level(getattr(self, "precision", None)),
        )
        config, choice = resolve_config(plugin, inputs)
        if choice is not None:
            self.auto_choice = choice
        _mark_moe_leaves(plugin, model, config)
        gas = int(get_value(config, "gradient_accumulation_steps"))  # resolve_config filled it
        if gas != request.gradient_accumulation_steps:
            logger.warning(
                "the DeepSpeed config sets gradient_accumulation_steps=%d; the Accelerator's %d is replaced",
                gas,
                request.gradient_accumulation_steps,
            )
            prepared.fixed_settings["gradient_accumulation_steps"] = gas
        kwargs: dict[str, object] = {"model": model, "config": config}
        if isinstance(optimizer, DummyOptim):
            kwargs["model_parameters"] = optimizer.params
        elif optimizer is not None:
            kwargs["optimizer"] = optimizer
        if isinstance(scheduler, DummyScheduler):
            if scheduler.lr_scheduler_callable is not None and "scheduler" not in config:
                kwargs["lr_scheduler"] = scheduler.lr_scheduler_callable
        elif scheduler is not None:
            kwargs["lr_scheduler"] = scheduler
        engine, ds_optimizer, _, ds_scheduler = engine_initializer(config)(**kwargs)
        self._record(prepared, engine, optimizer, ds_optimizer, scheduler, ds_scheduler)

    def _record(
        self,
        prepared: Prepared,
        engine: DeepSpeedEngine,
        optimizer: object,
        ds_optimizer: object,
        scheduler: object,
        ds_scheduler: object,
    ) -> None:
        """Keep the engine (the strategy steps through it) and list what the facade registers."""
        self.engines.append(engine)
        prepared.models.append(engine)
        opt_wrapper = None
        if optimizer is not None and ds_optimizer is not None:
            opt_wrapper = DeepSpeedOptimizerWrapper(ds_optimizer)
            prepared.optimizers.append(opt_wrapper)
            self.engine_wrapper = DeepSpeedEngineWrapper(engine)
            prepared.engine = self.engine_wrapper
        if scheduler is not None and ds_scheduler is not None:
            wrappers = [opt_wrapper] if opt_wrapper else []
            prepared.schedulers.append(DeepSpeedSchedulerWrapper(ds_scheduler, wrappers))

    # ----------------------------------------------------------------- training
    def backward(self, loss: torch.Tensor, **kwargs: object) -> None:
        """Backward, gradient reduction and (on sync micro-batches) the optimizer step, by the engine.

        Raises:
            ValueError: no model was prepared with an optimizer.
        """
        if self.engine_wrapper is None:
            raise ValueError(
                "accelerator.backward under DeepSpeed needs a model prepared with its optimizer "
                "(accelerator.prepare(model, optimizer, ...))"
            )
        self.engine_wrapper.backward(loss, sync_gradients=GradientState().sync_gradients, **kwargs)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Nothing to do: the engine reduces gradients only at its accumulation boundary.

        Overrides the base's public method (not its ``_no_sync`` hook): the engine has a ``no_sync``
        of its own, which refuses ZeRO-2/3, and must not be asked.
        """
        return contextlib.nullcontext()

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor | None:
        """Return the norm the engine computed; clipping itself is the config's ``gradient_clipping``."""
        if not self._warned_clip and self.engines:
            configured = float(self.engines[-1].gradient_clipping() or 0.0)
            if configured != float(max_norm):
                warnings.warn(
                    f"under DeepSpeed, gradients are clipped by the engine with gradient_clipping={configured} "
                    f"from the config, not max_norm={max_norm}; set gradient_clipping in the DeepSpeed "
                    "config or DeepSpeedPlugin(gradient_clipping=...)",
                    stacklevel=3,
                )
                self._warned_clip = True
        norm = self.engine_wrapper.get_global_grad_norm() if self.engine_wrapper is not None else None
        return torch.tensor(norm) if norm is not None else None

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        """Unsupported: DeepSpeed clips by norm only.

        Raises:
            NotImplementedError: always; use ``gradient_clipping`` in the DeepSpeed config.
        """
        raise NotImplementedError(
            "DeepSpeed clips gradients by norm only; set gradient_clipping in the DeepSpeed config"
        )

    def release(self) -> None:
        """Destroy every engine built so far (frees DeepSpeed's buffers and hooks).

        Meant for ``Accelerator.free_memory``; prepared objects must not be used afterwards.
        """
        for engine in self.engines:
            engine.destroy()
        self.engines.clear()
        self.engine_wrapper = None

    def sequence_parallel_dataloader(
        self, dataloader: torch.utils.data.DataLoader[object], model: torch.nn.Module
    ) -> Iterable[object]:
        """Wrap a prepared dataloader in DeepSpeed Ulysses' adapter: each sequence-parallel rank gets its slice.

        Raises:
            ValueError: no ``ParallelismConfig`` with ``sp_size > 1`` and ``sp_backend="deepspeed"``.
            ImportError: DeepSpeed (>= 0.18.2, with Ulysses sequence parallelism) is not installed.
            RuntimeError: DeepSpeed has no sequence-parallel group (Ulysses was not set up).
        """
        return ulysses_dataloader(
            dataloader, model, self.runtime.plugins.parallelism_config, self.runtime.device
        )

    # ------------------------------------------------------------- state dicts
    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict; under ZeRO-3 gathered from every process (call on all of them).

        Returns an empty dict on processes other than the main one under ZeRO-3.
        """
        if _is_engine(model) and model.zero_optimization_partition_weights():
            return model._zero3_consolidated_16bit_state_dict() or {}
        return self.unwrap_model(model, keep_torch_compile=False).state_dict()

    def load_model_state_dict(
        self, model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], strict: bool = True
    ) -> object:
        """Load a full state dict (under ZeRO-3 the main process's copy is scattered to the shards)."""
        module = self.unwrap_model(model, keep_torch_compile=False)
        if not (_is_engine(model) and model.zero_optimization_partition_weights()):
            return module.load_state_dict(state_dict, strict=strict)
        deepspeed = import_deepspeed()
        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=0):
            if self.runtime.is_main_process:
                return module.load_state_dict(state_dict, strict=strict)
        return None

    # ------------------------------------------------------------- checkpoints
    @staticmethod
    def _tag(index: int) -> str:
        return "pytorch_model" if index == 0 else f"pytorch_model_{index}"

    def save_model_checkpoint(
        self, model: torch.nn.Module, output_dir: str, index: int, safe_serialization: bool
    ) -> bool:
        """Write the engine checkpoint (weights, sharded optimizer and scheduler) on every process."""
        if not _is_engine(model):
            return False
        model.save_checkpoint(output_dir, tag=self._tag(index), save_latest=False)
        return True

    def load_model_checkpoint(self, model: torch.nn.Module, input_dir: str, index: int) -> bool:
        """Restore what ``save_model_checkpoint`` wrote.

        DeepSpeed 0.19's ``load_checkpoint`` has no ``weights_only`` option and its default checkpoint
        engine unpickles fully, so for the engines that read with a plain ``torch.load`` (the default
        ``TorchCheckpointEngine``, the fast and the decoupled one) their ``load`` is replaced, for this
        call, by accelerando's weights-only reader, which also accepts the few DeepSpeed types its
        checkpoints hold (``_DEEPSPEED_SAFE_TYPES``); ``load_kwargs={"weights_only": False}`` opts out
        as for the other files. Where DeepSpeed reads files itself it would still unpickle them fully
        (other checkpoint engines, e.g. Nebula or DataStates, and universal checkpoints, whose
        ``load_hp_checkpoint_state`` reads every parameter's file): such loads are refused unless the
        caller opts in with ``load_kwargs={"weights_only": False}``.

        Raises:
            FileNotFoundError: the folder has no engine checkpoint for this model.
            UnsafeCheckpointError: an engine file holds a type weights-only loading refuses, or the
                load would go through DeepSpeed's full unpickling (see above) without the opt-in.
        """
        if not _is_engine(model):
            return False
        _refuse_full_unpickling(model, os.path.join(input_dir, self._tag(index)))
        with _weights_only_engine_loads(model):
            path, _ = model.load_checkpoint(
                input_dir, tag=self._tag(index), load_optimizer_states=True, load_lr_scheduler_states=True
            )
        if path is None:
            raise FileNotFoundError(
                f"{input_dir!r} has no DeepSpeed checkpoint {self._tag(index)!r}; was it saved under DeepSpeed?"
            )
        return True

    # ------------------------------------------------- checkpoints across strategies
    def checkpoint_layout(
        self, models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> dict[str, object]:
        """A DeepSpeed engine checkpoint of this ZeRO stage."""
        stage = self.engines[0].zero_optimization_stage() if self.engines else 0
        return {"strategy": "deepspeed", "format": "deepspeed", "zero_stage": int(stage)}

    def reads_layout(self, layout: Mapping[str, object], saved_world: int) -> bool:
        """DeepSpeed's own loading: the same ZeRO stage on the same number of processes."""
        return (
            layout.get("format") == "deepspeed"
            and saved_world == self.runtime.num_processes
            and (not self.engines or layout.get("zero_stage") == self.engines[0].zero_optimization_stage())
        )

    def _full_shapes(self, model: torch.nn.Module) -> Mapping[str, torch.Size]:
        """The full shapes of an engine's module (ZeRO-3 parameters report theirs in ``ds_shape``)."""
        module = self.unwrap_model(model, keep_torch_compile=False)
        shapes = {n: getattr(p, "ds_shape", p.shape) for n, p in module.named_parameters()}
        shapes.update({n: b.shape for n, b in module.named_buffers()})
        return shapes

    def _check_converted_optimizers(
        self, conversion: C.Conversion, models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> None:
        """Each engine's optimizer state: one step counter per partition, the model's trainable parameters."""
        del optimizers  # an engine's optimizer is its model's: checked through the model
        for i, model in enumerate(models):
            module = self.unwrap_model(model, keep_torch_compile=False)
            optim = conversion.states[i].optimizer
            if optim is not None:
                _check_scalars(optim, conversion.folder)
                trainable = sorted(n for n, p in module.named_parameters() if p.requires_grad)
                if sorted(n for g in optim["param_groups"] for n in C.group_names(g)) != trainable:
                    raise C.CheckpointConversionError(
                        f"{conversion.folder!r}: the saved optimizer holds other parameters than model {i}'s "
                        "trainable ones; build the optimizer over the same parameters as when saving."
                    )

    def apply_converted_checkpoint(
        self, models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> None:
        """Write the portable state into each engine's partitions (any ZeRO stage, any process count)."""
        conversion, self._conversion = self._conversion, None
        assert conversion is not None, "read_converted_checkpoint read nothing"
        for model, portable in zip(models, conversion.states, strict=False):
            if _is_engine(model):
                apply_deepspeed(model, portable, self.load_model_state_dict)
            else:
                self.load_model_state_dict(model, portable.weights)

    def save_optimizer_checkpoint(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None, output_dir: str, index: int
    ) -> bool:
        """DeepSpeed optimizers are saved inside the engine checkpoint: nothing more to write."""
        return isinstance(optimizer, DeepSpeedOptimizerWrapper)

    def load_optimizer_checkpoint(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None, input_dir: str, index: int
    ) -> bool:
        """DeepSpeed optimizers are restored with the engine checkpoint: nothing more to read."""
        return isinstance(optimizer, DeepSpeedOptimizerWrapper)
