"""The Accelerator: one object a training script talks to, whatever runs underneath.

It is a facade. Settings are resolved by ``accelerando.settings``; the connector turns them into a
strategy (how models are wrapped, how processes talk) and a precision (how numbers are computed);
this class keeps the prepared objects, runs gradient accumulation, and delegates the rest.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import torch

import accelerando.connector as connector

# The reference's accelerate.accelerator module exposes these constants; scripts import them from it.
from accelerando.common.constants import (  # noqa: F401
    DTENSOR_PYTORCH_VERSION,
    FSDP2_PYTORCH_VERSION,
    FSDP_PYTORCH_VERSION,
    MODEL_NAME,
    PROFILE_PATTERN_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    SAFE_WEIGHTS_PATTERN_NAME,
    SCALER_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    WEIGHTS_PATTERN_NAME,
)

# Looked up in this module when a quantized model is prepared (as in the reference, whose tests patch
# ``accelerate.accelerator.is_bitsandbytes_multi_backend_available``).
from accelerando.common.imports import is_bitsandbytes_multi_backend_available, is_xpu_available  # noqa: F401
from accelerando.facade.collectives import CollectivesMixin
from accelerando.facade.observing import ObservingMixin
from accelerando.facade.parallelism_settings import default_parallelism_config
from accelerando.facade.preparing import PreparingMixin
from accelerando.facade.saving import SavingMixin
from accelerando.gradient_state import GradientState
from accelerando.optimizer import AcceleratedOptimizer
from accelerando.plugins.kwargs import (
    AutocastKwargs,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProfileKwargs,
)
from accelerando.runtime import Plugins, set_active_accelerator
from accelerando.scheduler import AcceleratedScheduler
from accelerando.state import AcceleratorState

__all__ = ["Accelerator"]

logger = logging.getLogger(__name__)


def _handlers_by_type(kwargs_handlers: list[Any] | None) -> dict[type, Any]:
    from accelerando.plugins.kwargs import KwargsHandler

    found: dict[type, Any] = {}
    for handler in kwargs_handlers or []:
        if not isinstance(handler, KwargsHandler):
            raise TypeError(
                f"kwargs_handlers accepts KwargsHandler instances (e.g. DistributedDataParallelKwargs()); "
                f"got {type(handler).__name__}"
            )
        if type(handler) in found:
            raise ValueError(f"kwargs_handlers has two {type(handler).__name__}; pass each kind once")
        found[type(handler)] = handler
    return found


def _code_settings(
    mixed_precision: Any,
    gradient_accumulation_steps: int | None,
    gradient_accumulation_plugin: Any,
    cpu: bool | None,
    dynamo_backend: Any,
    dynamo_plugin: Any,
) -> dict[str, Any]:
    """The Accelerator's arguments that are settings, as a code layer (None = not given).

    Raises:
        ValueError: both ways of giving accumulation steps, or of giving a dynamo backend, were used.
    """
    if gradient_accumulation_plugin is not None and gradient_accumulation_steps not in (None, 1):
        raise ValueError(
            "pass either gradient_accumulation_steps or gradient_accumulation_plugin, not both; "
            "set num_steps on the plugin"
        )
    if dynamo_plugin is not None and dynamo_backend is not None:
        raise ValueError("pass either dynamo_backend or dynamo_plugin, not both")
    backend = getattr(dynamo_plugin, "backend", None) or dynamo_backend
    return {
        "mixed_precision": str(mixed_precision) if mixed_precision is not None else None,
        "gradient_accumulation_steps": getattr(gradient_accumulation_plugin, "num_steps", None)
        or gradient_accumulation_steps,
        "cpu": cpu,
        "dynamo_backend": str(backend or "").lower() or None,
    }


def _accumulation_plugin(plugin: Any, settings: Any) -> Any:
    from accelerando.plugins.accumulation import GradientAccumulationPlugin

    if plugin is None:
        plugin = GradientAccumulationPlugin()
    plugin.num_steps = int(settings.gradient_accumulation_steps)
    return plugin


def _dataloader_config(config: Any, split_batches: bool | None) -> Any:
    from accelerando.plugins.dataloader import DataLoaderConfiguration

    if config is None:
        config = DataLoaderConfiguration()
    if split_batches is not None:
        config.split_batches = split_batches
    return config


def _project_config(config: Any, project_dir: str | None) -> Any:
    from accelerando.plugins.project import ProjectConfiguration

    if config is None:
        config = ProjectConfiguration()
    if project_dir is not None:
        config.set_directories(project_dir)
    return config


def _override_even_batches(dataloaders: list[Any], even_batches: bool | None) -> list[tuple[Any, bool]]:
    """Set ``even_batches`` on each map-style loader's batch sampler; return (sampler, old value) pairs.

    Only the batch sampler decides how the last batches are shared, so that is where the value
    goes. Loaders over iterable datasets (or dispatching loaders) are skipped with a warning.
    """
    from accelerando.data_loader.dispatcher import DataLoaderDispatcher

    if even_batches is None:
        return []
    overridden: list[tuple[Any, bool]] = []
    skipped = False
    for dl in dataloaders:
        sampler = getattr(dl, "batch_sampler", None)
        if not isinstance(dl, DataLoaderDispatcher) and hasattr(sampler, "even_batches"):
            overridden.append((sampler, sampler.even_batches))
            sampler.even_batches = even_batches
        else:
            skipped = True
    if skipped:
        warnings.warn(
            "join_uneven_inputs(even_batches=...) only changes dataloaders over map-style datasets; "
            "some prepared dataloaders read iterable datasets and keep their even_batches",
            stacklevel=3,
        )
    return overridden


class _Accumulation:
    """``Accelerator.accumulate``'s context: a plain class, as it is entered once per micro-batch."""

    __slots__ = ("_accelerator", "_models", "_stack")

    def __init__(self, accelerator: Accelerator, models: tuple[torch.nn.Module, ...]) -> None:
        self._accelerator = accelerator
        self._models = models
        self._stack: contextlib.AbstractContextManager | None = None

    def __enter__(self) -> None:
        accelerator = self._accelerator
        accelerator._do_sync()
        gs = accelerator.gradient_state
        if gs.sync_gradients or gs.sync_each_batch or not self._models:
            return
        strategy = accelerator._strategy
        if len(self._models) == 1:
            context = strategy.no_sync(self._models[0])
            context.__enter__()
            self._stack = context
            return
        stack = contextlib.ExitStack()
        try:
            for model in self._models:
                stack.enter_context(strategy.no_sync(model))
        except BaseException:
            stack.close()
            raise
        self._stack = stack

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        stack, self._stack = self._stack, None
        if stack is not None and stack.__exit__(exc_type, exc, tb):
            return True  # a no_sync context swallowed the exception, as it would inside ExitStack
        if exc_type is None:
            # The step is complete here (reached only without an exception): a preemption acts now.
            accelerator = self._accelerator
            preemption = accelerator._preemption
            if preemption is not None and preemption.should_stop(accelerator.state.num_processes):
                from accelerando.facade.preemption import checkpoint_and_exit

                checkpoint_and_exit(accelerator, preemption)
        return False


class Accelerator(PreparingMixin, CollectivesMixin, SavingMixin, ObservingMixin):
    """Prepare a PyTorch training loop to run on any hardware and number of processes.

    Every setting left as None comes from the launcher's environment (``accelerando launch`` or
    ``accelerate launch`` variables), else from the default; an explicit argument always wins (and
    a warning names both values when it overrides a launcher setting).

    Args:
        device_placement: move prepared models and batches to the process's device.
        split_batches: split each dataloader batch across processes instead of giving each process
            its own batches (prefer ``dataloader_config``).
        mixed_precision: "no", "fp16", "bf16" or "fp8".
        gradient_accumulation_steps: micro-batches per optimizer step (default 1).
        cpu: run on the CPU even if an accelerator is present.
        dataloader_config: ``DataLoaderConfiguration``.
        deepspeed_plugin, fsdp_plugin, torch_tp_plugin, megatron_lm_plugin: backend plugins.
        rng_types: RNGs synchronised at each epoch start by prepared dataloaders.
        log_with: tracker name(s), ``GeneralTracker`` instance(s) or "all".
        project_dir: folder for logs and checkpoints. project_config: ``ProjectConfiguration``.
        gradient_accumulation_plugin: ``GradientAccumulationPlugin`` (excludes
            ``gradient_accumulation_steps``).
        step_scheduler_with_optimizer: step prepared schedulers once per real optimizer step.
        kwargs_handlers: ``KwargsHandler`` instances (DDP, GradScaler, process group, autocast, ...).
        dynamo_backend / dynamo_plugin: compile the prepared model with ``torch.compile``.
        deepspeed_plugins: several named DeepSpeed plugins. parallelism_config: mesh layout.

    Raises:
        ValueError / TypeError: contradictory or invalid settings, naming where each came from.
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool | None = None,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int | None = None,
        cpu: bool | None = None,
        dataloader_config: Any = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        rng_types: list[str] | None = None,
        log_with: Any = None,
        project_dir: str | None = None,
        project_config: Any = None,
        gradient_accumulation_plugin: Any = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[Any] | None = None,
        dynamo_backend: Any = None,
        dynamo_plugin: Any = None,
        deepspeed_plugins: Any = None,
        parallelism_config: Any = None,
    ) -> None:
        code = _code_settings(
            mixed_precision,
            gradient_accumulation_steps,
            gradient_accumulation_plugin,
            cpu,
            dynamo_backend,
            dynamo_plugin,
        )
        plugins = Plugins(
            deepspeed=connector.normalise_deepspeed_plugins(deepspeed_plugin, deepspeed_plugins),
            fsdp=fsdp_plugin,
            megatron_lm=megatron_lm_plugin,
            torch_tp=torch_tp_plugin,
            parallelism_config=default_parallelism_config(parallelism_config),
            dynamo=dynamo_plugin,
            handlers=_handlers_by_type(kwargs_handlers),
        )
        self.runtime = connector.build(connector.resolve_settings(code), plugins)
        self.state = AcceleratorState()
        # The runtime is frozen: these are shortcuts for the training step, never re-pointed.
        self._strategy, self._precision = self.runtime.strategy, self.runtime.precision
        self.scaler = self._precision.scaler
        self.gradient_state = GradientState(
            gradient_accumulation_plugin=_accumulation_plugin(gradient_accumulation_plugin, self.settings)
        )
        self.dataloader_config = _dataloader_config(dataloader_config, split_batches)
        self.project_configuration = _project_config(project_config, project_dir)
        self.device_placement = device_placement
        self.rng_types = rng_types if rng_types is not None else ["generator"]
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.step = 0
        self.flag_tensor: torch.Tensor | None = None
        self.deepspeed_engine_wrapped: Any = None
        self._models: list[Any] = []
        self._optimizers: list[AcceleratedOptimizer] = []
        self._schedulers: list[AcceleratedScheduler] = []
        self._dataloaders: list[Any] = []
        self._init_saving()
        self._init_observing(log_with)
        # Opt-in fault handling: resume in the first prepare(), checkpoint-and-exit on SIGTERM/SIGUSR1.
        self._auto_resume_pending = bool(getattr(self.settings, "auto_resume", False))
        self._preemption: Any = None
        if self._auto_resume_pending or bool(getattr(self.settings, "preemption_checkpoint", False)):
            from accelerando.facade.preemption import install

            self._preemption = install(self)
        set_active_accelerator(self)

    # ------------------------------------------------------------- properties
    @property
    def settings(self) -> Any:
        """The resolved settings, each with its source (``settings.source("mixed_precision")``)."""
        return self.runtime.settings

    @property
    def dynamo_plugin(self) -> Any:
        """The ``TorchDynamoPlugin`` in effect (disabled without a backend)."""
        return self.runtime.plugins.dynamo

    @property
    def native_amp(self) -> bool:
        """Whether PyTorch's autocast runs the forward (fp16 / bf16)."""
        return self.settings.mixed_precision in ("fp16", "bf16")

    @property
    def ddp_handler(self) -> Any:
        """The ``DistributedDataParallelKwargs`` given in code, or None."""
        return self.runtime.plugins.handler(DistributedDataParallelKwargs)

    @property
    def scaler_handler(self) -> Any:
        """The ``GradScalerKwargs`` given in code, or None."""
        return self.runtime.plugins.handler(GradScalerKwargs)

    @property
    def init_handler(self) -> Any:
        """The ``InitProcessGroupKwargs`` given in code, or None."""
        return self.runtime.plugins.handler(InitProcessGroupKwargs)

    @property
    def autocast_handler(self) -> Any:
        """The ``AutocastKwargs`` given in code, or None."""
        return self.runtime.plugins.handler(AutocastKwargs)

    @property
    def profile_handler(self) -> Any:
        """The ``ProfileKwargs`` given in code, or None."""
        return self.runtime.plugins.handler(ProfileKwargs)

    @property
    def device(self) -> torch.device:
        """The device this process computes on."""
        return self.state.device

    @property
    def distributed_type(self) -> Any:
        """How processes cooperate (``DistributedType``)."""
        return self.state.distributed_type

    @property
    def num_processes(self) -> int:
        """Total number of processes."""
        return self.state.num_processes

    @property
    def process_index(self) -> int:
        """Global index of this process."""
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        """Index of this process on its machine."""
        return self.state.local_process_index

    @property
    def is_main_process(self) -> bool:
        """True on global process 0."""
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        """True on each machine's first process."""
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        """True on the last process."""
        return self.state.is_last_process

    @property
    def use_distributed(self) -> bool:
        """Whether several processes cooperate."""
        return self.state.use_distributed

    @property
    def mixed_precision(self) -> str:
        """The mixed-precision mode in effect."""
        return self.state.mixed_precision

    @property
    def sync_gradients(self) -> bool:
        """True on the micro-batch where gradients are synchronised and the optimizer steps."""
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state._set_sync_gradients(value)

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per optimizer step."""
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        self.gradient_state.num_steps = int(value)

    @property
    def split_batches(self) -> bool:
        """Whether batches are split across processes."""
        return bool(self.dataloader_config.split_batches)

    @property
    def dispatch_batches(self) -> bool | None:
        """Whether the main process reads batches and sends slices to the others."""
        return self.dataloader_config.dispatch_batches

    @property
    def even_batches(self) -> bool:
        """Whether short final batches are padded so every process gets as many."""
        return bool(self.dataloader_config.even_batches)

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    @property
    def use_seedable_sampler(self) -> bool:
        """Whether random samplers are replaced by a seedable one."""
        return bool(self.dataloader_config.use_seedable_sampler)

    @property
    def non_blocking(self) -> bool:
        """Whether batches are moved to the device asynchronously."""
        return bool(self.dataloader_config.non_blocking)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether any prepared optimizer skipped its last step (fp16 overflow)."""
        return any(opt.step_was_skipped for opt in self._optimizers)

    @property
    def deepspeed_plugin(self) -> Any:
        """The active DeepSpeed plugin, or None."""
        return self.state.deepspeed_plugin

    @property
    def is_fsdp2(self) -> bool:
        """Whether FSDP version 2 (``fully_shard``) is in use."""
        plugin = self.state.fsdp_plugin
        return plugin is not None and getattr(plugin, "fsdp_version", 1) == 2

    @property
    def fp8_backend(self) -> Any:
        """The FP8 backend in use, an ``FP8BackendType`` (AO, TE or MSAMP; NO unless mixed_precision is fp8)."""
        from accelerando.enums import FP8BackendType

        return getattr(self._precision, "fp8_backend", FP8BackendType.NO)

    @property
    def multi_device(self) -> bool:
        """Whether several processes run plain data parallelism on accelerator devices (GPUs, NPUs...)."""
        return connector.is_multi_device(self.distributed_type)

    @property
    def parallelism_config(self) -> Any:
        """The ``ParallelismConfig`` given to the Accelerator, or None."""
        return self.runtime.plugins.parallelism_config

    @property
    def use_stateful_dataloader(self) -> bool:
        """Whether prepared dataloaders are torchdata ``StatefulDataLoader`` s (``DataLoaderConfiguration``)."""
        return bool(self.dataloader_config.use_stateful_dataloader)

    @property
    def torch_device_mesh(self) -> Any:
        """The device mesh of a parallelism config (or of the pipeline strategy), or None."""
        return self.state.device_mesh

    def _mesh_rank(self, dim: str) -> int:
        """This process's rank along a mesh dimension (raw or flattened); 0 when the mesh lacks it."""
        mesh = self.state.device_mesh
        if mesh is None:
            return 0
        try:
            return int(mesh[dim].get_local_rank())
        except (KeyError, RuntimeError, ValueError):
            return 0

    @property
    def tensor_parallel_rank(self) -> int:
        """Rank on the tensor-parallel mesh axis (0 without one)."""
        return self._mesh_rank("tp")

    @property
    def pipeline_parallel_rank(self) -> int:
        """Rank on the pipeline-parallel mesh axis (0 without one)."""
        return self._mesh_rank("pp")

    @property
    def context_parallel_rank(self) -> int:
        """Rank on the context-parallel mesh axis (0 without one)."""
        return self._mesh_rank("cp")

    @property
    def data_parallel_rank(self) -> int:
        """Rank among the processes that read different batches (the process index without a mesh).

        With a mesh it is the rank on the flattened ``dp`` dimension (replicas x shards).
        """
        if self.state.device_mesh is None:
            return self.process_index
        return self._mesh_rank("dp")

    @property
    def data_parallel_shard_rank(self) -> int:
        """Rank on the FSDP ``dp_shard`` mesh axis (0 without a sharding axis)."""
        config = self.parallelism_config
        if config is None or not config.dp_shard_enabled:
            return 0
        return self._mesh_rank("dp_shard")

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        """Whether the composable (DTensor / ``fully_shard``) stack is in use, i.e. FSDP2.

        Tensor and context parallelism compose onto it.
        """
        return self.is_fsdp2

    @property
    def should_save_model(self) -> bool:
        """Whether this process writes model files when every process saves its part.

        Replicas (a ``dp_replicate`` rank other than 0) and context-parallel copies (a ``cp`` rank
        other than 0) hold what another process already writes, so they do not. Without a
        parallelism config, each machine's first process saves.
        """
        config = self.parallelism_config
        if config is None:
            return self.is_local_main_process
        duplicate_dims = [
            dim
            for dim, on in (("dp_replicate", config.dp_replicate_enabled), ("cp", config.cp_enabled))
            if on
        ]
        return all(self._mesh_rank(dim) == 0 for dim in duplicate_dims)

    def deepspeed_ulysses_dl_adapter(self, dl: Any, model: torch.nn.Module) -> Any:
        """Wrap a prepared dataloader so that each sequence-parallel rank gets its slice of every batch.

        ``prepare`` does this itself for dataloaders prepared together with the model; call it for a
        dataloader prepared on its own. Uses DeepSpeed's ``UlyssesSPDataLoaderAdapter`` with the
        sequence-parallel group DeepSpeed set up.

        Raises:
            ValueError: no ``ParallelismConfig`` with ``sp_size > 1`` and ``sp_backend="deepspeed"``.
            ImportError: DeepSpeed (>= 0.18.2, with Ulysses sequence parallelism) is not installed.
            RuntimeError: DeepSpeed has no sequence-parallel group (Ulysses was not set up).
        """
        from accelerando.parallelism_config import SP_BACKEND_DEEPSPEED

        config = self.parallelism_config
        if config is None or not config.sp_enabled or config.sp_backend != SP_BACKEND_DEEPSPEED:
            raise ValueError(
                "deepspeed_ulysses_dl_adapter needs sequence parallelism: pass "
                "Accelerator(parallelism_config=ParallelismConfig(sp_size=N, sp_backend='deepspeed')) with a "
                "DeepSpeed plugin"
            )
        try:
            from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
            from deepspeed.utils import groups
        except ImportError as exc:
            raise ImportError(
                "sequence parallelism needs DeepSpeed Ulysses: pip install 'deepspeed>=0.18.2'"
            ) from exc
        try:
            sp_group = groups._get_sequence_parallel_group()
        except (KeyError, AssertionError, AttributeError) as exc:
            raise RuntimeError(
                "DeepSpeed has no sequence-parallel group: Ulysses sequence parallelism must be set up "
                "(DeepSpeed on GPUs, with the model's attention registered for Ulysses) before its "
                "dataloaders are adapted"
            ) from exc
        return UlyssesSPDataLoaderAdapter(
            dl,
            sp_rank=groups._get_sequence_parallel_rank(),
            sp_group=sp_group,
            sp_world_size=groups._get_sequence_parallel_world_size(),
            device=getattr(model, "device", self.device),
        )

    @property
    def project_dir(self) -> str | None:
        """The project folder."""
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        """The folder trackers write to."""
        return self.project_configuration.logging_dir

    @property
    def resume_point(self) -> Any:
        """Where the last ``load_state`` left the run (epoch, step, batches to skip), or None."""
        from accelerando.checkpointing import resume_point

        return resume_point(self)

    @property
    def save_iteration(self) -> int:
        """The number the next automatically named checkpoint gets."""
        return self.project_configuration.iteration

    # --------------------------------------------------------------- training
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Back-propagate ``loss``: divided by the accumulation steps, scaled under fp16."""
        steps = self.gradient_state.num_steps
        if steps > 1 and self._strategy.divides_loss_for_accumulation:
            loss = loss / steps
        self._strategy.backward(loss, **kwargs)

    def _do_sync(self) -> None:
        gs = self.gradient_state
        ref = gs._active_dataloader_ref  # a weak reference (calling it is no Python-level call)
        loader = ref() if ref is not None else None
        if gs._sync_with_dataloader and loader is not None and loader.end_of_dataloader:
            self.step = 0
            gs.sync_gradients = True
        else:
            self.step += 1
            gs.sync_gradients = self.step % gs._num_steps == 0

    def accumulate(self, *models: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Context for one micro-batch: decides whether this is a sync step and skips the all-reduce otherwise.

        Inside, ``sync_gradients`` says whether the optimizer will really step. Gradients are
        synchronised on every ``gradient_accumulation_steps``-th micro-batch and on the last batch of
        the dataloader (``sync_with_dataloader``); with ``sync_each_batch`` they are all-reduced on
        every micro-batch but the optimizer still steps only on sync steps. On leaving the context
        without an exception, a pending preemption checkpoints and exits.
        """
        return _Accumulation(self, models)

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Context in which backward passes of ``model`` accumulate locally without all-reduce."""
        with self._strategy.no_sync(model):
            yield

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """Context forcing the next backward of ``model`` to synchronise, even inside ``no_sync``."""
        with self._strategy.trigger_sync_in_backward(model):
            yield

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None) -> Iterator[None]:
        """Context letting processes with fewer batches finish without hanging (DDP's Join).

        With ``even_batches`` given, the dataloaders prepared before the context use it for its
        duration (set on their batch samplers) and get their own value back on exit; loaders over
        iterable datasets cannot change it and are left alone with a warning.
        """
        overridden = _override_even_batches(self._dataloaders, even_batches)
        try:
            with self._strategy.join_uneven_inputs(joinables, even_batches):
                yield
        finally:
            for sampler, value in overridden:
                sampler.even_batches = value

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divide gradients by the fp16 loss scale (a no-op in other precisions)."""
        if self._precision.scaler is None or not self.gradient_state.sync_gradients:
            return
        targets = (
            self._optimizers
            if optimizer is None
            else (optimizer if isinstance(optimizer, list) else [optimizer])
        )
        for opt in targets:
            self._precision.unscale_(getattr(opt, "optimizer", opt))

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        """Clip the gradient norm (unscaling fp16 gradients first); return the norm before clipping."""
        self.unscale_gradients()
        return self._strategy.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Clamp gradients into ``[-clip_value, clip_value]`` (unscaling fp16 gradients first)."""
        self.unscale_gradients()
        self._strategy.clip_grad_value_(parameters, clip_value)

    def autocast(self, autocast_handler: Any = None) -> contextlib.AbstractContextManager:
        """Context running its block in the mixed precision (an ``AutocastKwargs`` may tune it)."""
        handler = autocast_handler or self.autocast_handler
        if handler is None:
            return self._precision.autocast()
        return self._precision.autocast(enabled=handler.enabled, cache_enabled=handler.cache_enabled)

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        """Backward and update in one pass for LOMO / AdaLomo optimizers.

        Raises:
            ValueError: no prepared optimizer is a LOMO optimizer.
        """
        for opt in self._optimizers:
            inner = opt.optimizer
            if hasattr(inner, "fused_backward"):
                inner.fused_backward(loss, learning_rate)
                return
        raise ValueError(
            "lomo_backward needs a prepared LOMO or AdaLomo optimizer (from the lomo-optim package)"
        )

    @contextlib.contextmanager
    def maybe_context_parallel(
        self, buffers: Any = None, buffer_seq_dims: Any = None, no_restore_buffers: Any = None
    ) -> Iterator[None]:
        """Shard ``buffers`` along their sequence dims over the ``cp`` mesh axis for the block.

        A no-op unless the parallelism config has ``cp_size > 1``; then torch's context parallelism
        (CUDA attention kernels) runs inside the block.

        Raises:
            ValueError: ``cp_size > 1`` on a device other than CUDA (the message says why and the fix).
        """
        config = self.state.parallelism_config
        if config is None or getattr(config, "cp_size", 1) <= 1:
            yield
            return
        from accelerando.strategies.pipeline.context_parallel import (
            check_context_parallel_device,
            context_parallel_context,
        )

        check_context_parallel_device(config.cp_size, self.device.type)
        handler = getattr(config, "cp_handler", None)
        with context_parallel_context(
            self.torch_device_mesh,
            buffers=buffers,
            buffer_seq_dims=buffer_seq_dims,
            no_restore_buffers=no_restore_buffers,
            rotate_method=getattr(handler, "cp_comm_strategy", None),
        ):
            yield

    # ------------------------------------------------------------------ models
    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> torch.nn.Module:
        """Return the user's module inside DDP / FSDP / DeepSpeed / torch.compile wrappers.

        With ``keep_fp32_wrapper=False`` the mixed-precision forward wrapper is removed too.
        """
        return self._strategy.unwrap_model(
            model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile
        )

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """True when ``model`` (or a submodule) was dispatched over several devices with a device map."""
        for module in model.modules():
            device_map = getattr(module, "hf_device_map", None)
            if device_map is not None and len(set(device_map.values())) > 1:
                return True
        return False

    def _refuse_quantized_offload(self, model: torch.nn.Module) -> None:
        """Refuse to train an 8-bit / 4-bit model with parts offloaded to the CPU or disk.

        Raises:
            ValueError: the model was loaded in 8 or 4 bits and its ``hf_device_map`` places modules on
                ``"disk"``, or on ``"cpu"`` without a bitsandbytes build that runs on the CPU.
        """
        if not (getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False)):
            return
        places = {str(place) for place in (getattr(model, "hf_device_map", None) or {}).values()}
        if "disk" in places or ("cpu" in places and not is_bitsandbytes_multi_backend_available()):
            raise ValueError(
                "You can't train a model that has been loaded in 8-bit or 4-bit precision with CPU or disk "
                "offload. If you want train the 8-bit or 4-bit model in CPU, please install bitsandbytes with "
                "multi-backend, see https://huggingface.co/docs/bitsandbytes/main/en/installation#multi-backend"
            )

    def free_memory(self, *objects: Any) -> list[Any]:
        """Drop references to every prepared object, collect garbage and empty device caches.

        Returns ``objects`` replaced by Nones, to rebind: ``model, opt = accelerator.free_memory(model, opt)``.
        """
        self._models.clear()
        self._optimizers.clear()
        self._schedulers.clear()
        self._dataloaders.clear()
        self.step = 0
        release = getattr(self._strategy, "release", None)
        if release is not None:
            release()  # e.g. DeepSpeed engines hold buffers outside the prepared objects
        from accelerando.checkpointing.lock import release as release_project_lock

        release_project_lock(self)  # another run may now save into this project folder
        gc.collect()
        self.state.device_backend.empty_cache()
        return [None for _ in objects]

    def clear(self, *objects: Any) -> list[Any]:
        """Alias of ``free_memory``."""
        return self.free_memory(*objects)

    def __repr__(self) -> str:
        return f"Accelerator(distributed_type={self.distributed_type}, num_processes={self.num_processes}, device={self.device}, mixed_precision={self.mixed_precision})"
