"""The Accelerator: one object a training script talks to, whatever runs underneath.

A facade composed of services, each built in ``_compose`` from what it needs (see
``accelerando.facade``): the registry of prepared objects, the preparer, the checkpoint service,
the collectives, observability (trackers, profiler) and the mesh ranks. The connector chose the
strategy and precision. What stays here is the training step (accumulate, backward, clipping), which
runs on every micro-batch and reads its few attributes directly, and one-line delegations.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

import torch

import accelerando.backends.connector as connector
from accelerando.backends.precision.base import Precision
from accelerando.backends.strategies.base import ScalesLossForAccumulation, Strategy

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
from accelerando.core.enums import FP8BackendType
from accelerando.core.gradient_state import GradientState
from accelerando.core.runtime import Plugins, set_active_accelerator
from accelerando.facade import handler_views
from accelerando.facade import options as arguments
from accelerando.facade.accumulation import Accumulation, override_even_batches
from accelerando.facade.checkpoint_service import CheckpointService
from accelerando.facade.collectives import Collectives, process_filter
from accelerando.facade.context import ServiceContext
from accelerando.facade.delegation import delegate, forwarded
from accelerando.facade.observing import Observability
from accelerando.facade.parallelism_settings import default_parallelism_config
from accelerando.facade.preparer import Preparer, verify_device_map
from accelerando.facade.registry import PreparedObjects
from accelerando.facade.topology import MeshRanks
from accelerando.state import AcceleratorState

if TYPE_CHECKING:
    from typing_extensions import TypeVarTuple, Unpack

    _Objects = TypeVarTuple("_Objects")
    from torch.distributed.algorithms.join import Joinable
    from torch.utils.data import DataLoader

    from accelerando.backends.trackers.base import GeneralTracker
    from accelerando.checkpointing.project import ResumePoint
    from accelerando.core.enums import DynamoBackend
    from accelerando.core.enums_on_demand import LoggerType
    from accelerando.core.settings import Settings
    from accelerando.facade.preemption import PreemptionWatch
    from accelerando.parallelism_config import ParallelismConfig
    from accelerando.plugins.accumulation import GradientAccumulationPlugin
    from accelerando.plugins.dataloader import DataLoaderConfiguration
    from accelerando.plugins.deepspeed import DeepSpeedPlugin
    from accelerando.plugins.dynamo import TorchDynamoPlugin
    from accelerando.plugins.fsdp import FullyShardedDataParallelPlugin
    from accelerando.plugins.kwargs import AutocastKwargs, KwargsHandler
    from accelerando.plugins.megatron import MegatronLMPlugin
    from accelerando.plugins.project import ProjectConfiguration
    from accelerando.plugins.tensor_parallel import TorchTensorParallelPlugin

    #: What ``log_with`` accepts: tracker names, ``LoggerType`` members, trackers (classes or
    #: instances), or a list of them.
    TrackerChoice = str | LoggerType | GeneralTracker | type[GeneralTracker]
    LogWith = TrackerChoice | list[TrackerChoice] | None

__all__ = ["Accelerator"]

F = TypeVar("F", bound=Callable[..., object])
# ``prepare`` gives each object back as the type it was given (the prepared wrapper behaves as it), so
# a user's ``model, optimizer = accelerator.prepare(model, optimizer)`` keeps completion and checks.
_P1 = TypeVar("_P1")
_Placement = Sequence[bool | None] | None
_Module = TypeVar("_Module", bound=torch.nn.Module)

logger = logging.getLogger(__name__)


# The reference's accelerate.accelerator module holds these two availability checks, and its tests patch
# them there; here they are module attributes read from common.imports on first access (that module is
# not needed by a first Accelerator), and a patched one is what _bitsandbytes_runs_on_cpu calls.
_AVAILABILITY_CHECKS = ("is_bitsandbytes_multi_backend_available", "is_xpu_available")


def __getattr__(name: str) -> object:
    """The reference's availability checks, and the other names its ``accelerate.accelerator``
    module holds (``facade.reference_names``), as attributes of this module (PEP 562).

    Raises:
        AttributeError: for any other name.
    """
    from accelerando.facade.reference_names import ACCELERATOR_MODULE_NAMES

    owner = (
        "accelerando.common.imports" if name in _AVAILABILITY_CHECKS else ACCELERATOR_MODULE_NAMES.get(name)
    )
    if owner is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(owner), name)


def _bitsandbytes_runs_on_cpu() -> bool:
    # A patch of the module attribute (``mock.patch("accelerate.accelerator.<check>")``) lands in the
    # module's namespace; without one, the check comes from common.imports.
    check = globals().get("is_bitsandbytes_multi_backend_available") or __getattr__(
        "is_bitsandbytes_multi_backend_available"
    )
    return bool(cast("Callable[..., bool]", check)())


def _handler(kind: str, doc: str) -> property:
    """A property returning the kwargs handler of class ``kind`` (named in ``plugins.kwargs``) given in code, or None."""

    def read(self: Accelerator) -> object:
        if not self.runtime.plugins.handlers:
            return None
        # Deferred: the handler classes load only once a script has built one (then this import is free).
        from accelerando.plugins import kwargs

        return self.runtime.plugins.handler(getattr(kwargs, kind))

    return property(read, doc=doc)


def _loader_flag(name: str, doc: str, writable: bool = False) -> property:
    """A property reading ``dataloader_config.<name>`` as a bool (and writing it when ``writable``)."""
    setter = (lambda self, value: setattr(self._options.dataloader_config, name, value)) if writable else None
    return property(lambda self: bool(getattr(self._options.dataloader_config, name)), setter, doc=doc)


def _filter(
    owner: Accelerator | F, function: F | None, name: str, **index: int | None
) -> F | Callable[[F], F]:
    """A process filter bound (``@accelerator.on_main_process``), called (``...()``) or unbound on the class."""
    if not isinstance(
        owner, Accelerator
    ):  # unbound (``Accelerator.on_main_process(fn)``): owner is the function
        return process_filter(owner, name, **index)
    if function is None:
        if not index:
            return getattr(owner, name)

        def decorate(function: F) -> F:
            return process_filter(function, name, **index)

        return decorate
    return process_filter(function, name, **index)


class Accelerator:
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
        elastic_batch: accelerando's own: what ``load_state`` keeps when the number of processes
            changed since the save. ``"keep_accumulation"`` (default) keeps
            ``gradient_accumulation_steps``; ``"keep_global"`` changes it so the batch of each
            optimizer step (per-process batch x processes x accumulation steps) stays the saved one
            where that divides, and the learning-rate schedule advances as it did. Also the
            ``--elastic_batch`` flag, ``ACCELERANDO_ELASTIC_BATCH`` and the config key ``elastic_batch``.

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
        dataloader_config: DataLoaderConfiguration | None = None,
        deepspeed_plugin: DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None = None,
        fsdp_plugin: FullyShardedDataParallelPlugin | None = None,
        torch_tp_plugin: TorchTensorParallelPlugin | None = None,
        megatron_lm_plugin: MegatronLMPlugin | None = None,
        rng_types: list[str] | None = None,
        log_with: LogWith = None,
        project_dir: str | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[KwargsHandler] | None = None,
        dynamo_backend: DynamoBackend | str | None = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugins: dict[str, DeepSpeedPlugin] | None = None,
        parallelism_config: ParallelismConfig | None = None,
        elastic_batch: str | None = None,
    ) -> None:
        steps, plugin = gradient_accumulation_steps, gradient_accumulation_plugin
        code = arguments.code_settings(mixed_precision, steps, plugin, cpu, dynamo_backend, dynamo_plugin)
        if elastic_batch is not None:
            code["elastic_batch"] = elastic_batch
        code = connector.join_live_state(code)  # one mixed-precision mode per process, as the reference
        plugins = Plugins(
            deepspeed=connector.normalise_deepspeed_plugins(deepspeed_plugin, deepspeed_plugins),
            fsdp=fsdp_plugin,
            megatron_lm=megatron_lm_plugin,
            torch_tp=torch_tp_plugin,
            parallelism_config=default_parallelism_config(parallelism_config),
            dynamo=dynamo_plugin,
            handlers=arguments.handlers_by_type(kwargs_handlers),
        )
        built = connector.build(connector.resolve_settings(code), plugins)
        self.runtime = built.runtime
        self.state = AcceleratorState()
        # The strategy and precision the connector built beside the Runtime: fixed for this Accelerator.
        self._strategy: Strategy = built.strategy
        self._precision: Precision = built.precision
        self.scaler = self._precision.scaler
        plugin = arguments.accumulation_plugin(plugin, self.settings)
        self.gradient_state = GradientState(gradient_accumulation_plugin=plugin)
        self.step = 0
        self._options = arguments.AcceleratorOptions(
            dataloader_config=arguments.dataloader_config(dataloader_config, split_batches),
            project_configuration=arguments.project_config(project_config, project_dir),
            device_placement=device_placement,
            rng_types=rng_types if rng_types is not None else ["generator"],
            step_scheduler_with_optimizer=step_scheduler_with_optimizer,
        )
        self._compose(log_with)
        set_active_accelerator(self)

    def _compose(self, log_with: LogWith) -> None:
        """Build the services, each from what it needs, and arm the opt-in fault handling."""
        registry = self._registry = PreparedObjects()
        # One record of what the services share, built once; each service takes it plus its own extras.
        context = ServiceContext(
            runtime=self.runtime,
            strategy=self._strategy,
            precision=self._precision,
            state=self.state,
            gradient_state=self.gradient_state,
            options=self._options,
            registry=registry,
        )
        self._preparer = Preparer(context, _bitsandbytes_runs_on_cpu)
        self._collectives = Collectives(context)
        self._observability = Observability(context, log_with, self.profile_handler)
        self._checkpoints = CheckpointService(context, self, self._observability)
        self._checkpoint_target = self._checkpoints.target
        self._mesh_ranks = MeshRanks(context)
        # Opt-in fault handling: resume in the first prepare(), checkpoint-and-exit on SIGTERM/SIGUSR1.
        auto_resume = self.settings.auto_resume
        self._preemption: PreemptionWatch | None = None
        if auto_resume or self.settings.preemption_checkpoint:
            from accelerando.facade.preemption import install  # deferred: opt-in, off by default

            self._preemption = install(self._options.project_configuration)
        if auto_resume:
            from accelerando.facade.resume import resume_on_prepare  # deferred: opt-in, off by default

            self._preparer.after_first_prepare = functools.partial(resume_on_prepare, self._checkpoints)

    # ------------------------------------------------- the reference's attributes
    _models = forwarded("_registry.models", "The prepared models.", writable=True)
    _optimizers = forwarded("_registry.optimizers", "The prepared optimizers.", writable=True)
    _schedulers = forwarded("_registry.schedulers", "The prepared schedulers.", writable=True)
    _dataloaders = forwarded("_registry.dataloaders", "The prepared dataloaders.", writable=True)
    _custom_objects = forwarded("_registry.custom_objects", "Checkpointed objects.", writable=True)
    _save_model_state_pre_hook = forwarded("_registry.save_hooks", "save_state pre-hooks by id.")
    _load_model_state_pre_hook = forwarded("_registry.load_hooks", "load_state pre-hooks by id.")
    deepspeed_engine_wrapped = forwarded("_registry.engine", "The DeepSpeed engine, or None.", writable=True)
    flag_tensor = forwarded("_collectives.flag_tensor", "set_trigger's flag, or None.", writable=True)
    dataloader_config = forwarded("_options.dataloader_config", "The DataLoaderConfiguration.", writable=True)
    project_configuration = forwarded(
        "_options.project_configuration", "The ProjectConfiguration.", writable=True
    )
    device_placement = forwarded("_options.device_placement", "Default device placement.", writable=True)
    rng_types = forwarded("_options.rng_types", "RNGs synchronised by dataloaders.", writable=True)
    step_scheduler_with_optimizer = forwarded(
        "_options.step_scheduler_with_optimizer", "Schedulers step with optimizer steps.", writable=True
    )

    # ------------------------------------------------------------- properties
    if TYPE_CHECKING:  # the same read, typed: every setting is a typed attribute of Settings

        @property
        def settings(self) -> Settings:
            """The resolved settings, each with its source."""
            ...

    else:
        settings = forwarded("runtime.settings", "The resolved settings, each with its source.")
    dynamo_plugin = forwarded("runtime.plugins.dynamo", "The TorchDynamoPlugin in effect.")
    parallelism_config = forwarded("runtime.plugins.parallelism_config", "The ParallelismConfig, or None.")
    ddp_handler = _handler("DistributedDataParallelKwargs", "The DDP kwargs given in code, or None.")
    scaler_handler = _handler("GradScalerKwargs", "The GradScalerKwargs given in code, or None.")
    init_handler = _handler("InitProcessGroupKwargs", "The InitProcessGroupKwargs given, or None.")
    autocast_handler = _handler("AutocastKwargs", "The AutocastKwargs given in code, or None.")
    profile_handler = _handler("ProfileKwargs", "The ProfileKwargs given in code, or None.")
    fp8_recipe_handler = _handler(
        "FP8RecipeKwargs", "The (deprecated) FP8RecipeKwargs given in code, or None."
    )
    ao_recipe_handler = handler_views.fp8_recipe_handler("AO", "The torchao FP8 recipe in effect, or None.")
    te_recipe_handler = handler_views.fp8_recipe_handler(
        "TE", "The Transformer Engine recipe in effect, or None."
    )
    msamp_recipe_handler = handler_views.fp8_recipe_handler("MSAMP", "The MS-AMP recipe in effect, or None.")
    has_fp8_handler = property(
        handler_views.has_fp8_handler, doc="Whether an FP8 recipe handler is in effect."
    )
    has_lomo_optimizer = property(
        handler_views.has_lomo_optimizer, doc="Whether a LOMO optimizer is prepared."
    )
    log_with = property(
        handler_views.requested_loggers, doc="The trackers log_with asked for (LoggerType or yours)."
    )
    device = forwarded("state.device", "The device this process computes on.")
    distributed_type = forwarded("runtime.distributed_type", "How processes cooperate (DistributedType).")
    num_processes = forwarded("state.num_processes", "Total number of processes.")
    process_index = forwarded("state.process_index", "Global index of this process.")
    local_process_index = forwarded("state.local_process_index", "Index of this process on its machine.")
    is_local_main_process = forwarded("state.is_local_main_process", "True on each machine's first process.")
    is_last_process = forwarded("state.is_last_process", "True on the last process.")
    use_distributed = forwarded("state.use_distributed", "Whether several processes cooperate.")
    mixed_precision = forwarded("runtime.mixed_precision", "This Accelerator's mixed-precision mode.")
    torch_device_mesh = forwarded("runtime.mesh", "This Accelerator's device mesh, or None.")
    split_batches = _loader_flag("split_batches", "Whether batches are split across processes.")
    dispatch_batches = forwarded("_options.dataloader_config.dispatch_batches", "Main process dispatches.")
    even_batches = _loader_flag("even_batches", "Whether short last batches are padded.", writable=True)
    use_seedable_sampler = _loader_flag("use_seedable_sampler", "Whether random samplers are seedable.")
    non_blocking = _loader_flag("non_blocking", "Whether batches move to the device asynchronously.")
    use_stateful_dataloader = _loader_flag("use_stateful_dataloader", "Whether loaders are stateful.")
    tensor_parallel_rank = forwarded("_mesh_ranks.tensor_parallel_rank", "Rank on the tp axis.")
    pipeline_parallel_rank = forwarded("_mesh_ranks.pipeline_parallel_rank", "Rank on the pp axis.")
    context_parallel_rank = forwarded("_mesh_ranks.context_parallel_rank", "Rank on the cp axis.")
    data_parallel_rank = forwarded("_mesh_ranks.data_parallel_rank", "Rank among data-parallel processes.")
    data_parallel_shard_rank = forwarded("_mesh_ranks.data_parallel_shard_rank", "Rank on the dp_shard axis.")
    should_save_model = forwarded("_mesh_ranks.should_save_model", "Whether this process writes model files.")
    is_composable_parallelism_enabled = forwarded("is_fsdp2", "Whether the FSDP2 stack is in use.")
    project_dir = forwarded("_options.project_configuration.project_dir", "The project folder.")
    logging_dir = forwarded("_options.project_configuration.logging_dir", "The folder trackers write to.")
    save_iteration = forwarded("_options.project_configuration.iteration", "The next checkpoint number.")
    trackers = forwarded("_observability.trackers", "The trackers started by init_trackers.")

    @property
    def is_main_process(self) -> bool:
        """True on global process 0."""
        return self.state.is_main_process

    @property
    def native_amp(self) -> bool:
        """Whether PyTorch's autocast runs the forward (fp16 / bf16)."""
        return self.settings.mixed_precision in ("fp16", "bf16")

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
    def optimizer_step_was_skipped(self) -> bool:
        """Whether any prepared optimizer skipped its last step (fp16 overflow)."""
        return any(opt.step_was_skipped for opt in self._registry.optimizers)

    @property
    def is_fsdp2(self) -> bool:
        """Whether FSDP version 2 (``fully_shard``) is in use."""
        plugin = self.runtime.plugins.fsdp
        return plugin is not None and getattr(plugin, "fsdp_version", 1) == 2

    @property
    def deepspeed_plugin(self) -> DeepSpeedPlugin | None:
        """The active DeepSpeed plugin of this Accelerator (the one selected by name), or None."""
        plugins = self.runtime.plugins.deepspeed
        if not plugins:
            return None
        # Which plugin is selected is the process view's one piece of state (select_deepspeed_plugin).
        name = getattr(self.state, "active_deepspeed_plugin_name", None)
        return plugins.get(name) if name in plugins else next(iter(plugins.values()))

    @property
    def fp8_backend(self) -> FP8BackendType:
        """The FP8 backend in use, an ``FP8BackendType`` (AO, TE or MSAMP; NO unless mixed_precision is fp8)."""
        return getattr(self._precision, "fp8_backend", FP8BackendType.NO)

    @property
    def fp8_enabled(self) -> bool:
        """Whether training runs in FP8 (``mixed_precision="fp8"``, through one of the FP8 backends)."""
        return self.fp8_backend != FP8BackendType.NO

    @property
    def delayed_fp8_autocast(self) -> bool:
        """Whether FP8 autocast runs inside the wrapped model's forward instead of around it (the
        reference does so for Transformer Engine under DDP/FSDP); False unless the precision says so.
        """
        return bool(getattr(self._precision, "delayed_fp8_autocast", False))

    @property
    def multi_device(self) -> bool:
        """Whether several processes run plain data parallelism on accelerator devices (GPUs, NPUs...)."""
        return connector.is_multi_device(self.distributed_type)

    @property
    def resume_point(self) -> ResumePoint | None:
        """Where the last ``load_state`` left the run (epoch, step, batches to skip), or None."""
        from accelerando.checkpointing.project import RESUME_POINT

        return self._checkpoint_target.memory.peek(RESUME_POINT)

    # ---------------------------------------------------------------- prepare
    @overload
    def prepare(self, a: _P1, /, *, device_placement: _Placement = None) -> _P1: ...
    @overload
    def prepare(
        self, *objects: Unpack[_Objects], device_placement: _Placement = None
    ) -> tuple[Unpack[_Objects]]: ...
    def prepare(self, *args: object, device_placement: _Placement = None) -> object:
        """Prepare models, optimizers, dataloaders and schedulers, in any mix and order.

        Returns the prepared objects in the order given (the object itself when one was passed), each
        typed as what was passed. An object that was already prepared comes back unchanged. Models are
        prepared first (some strategies need them wrapped before their optimizers), then optimizers,
        dataloaders, schedulers.

        Args:
            *args: The objects to prepare.
            device_placement: One entry per object: whether to move it to the device (None: the
                Accelerator's ``device_placement``).

        Raises:
            ValueError: ``device_placement`` has the wrong length.

        Example:
            >>> model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # doctest: +SKIP
        """
        return self._preparer.prepare(*args, device_placement=device_placement)

    prepare_model = delegate("_preparer", Preparer.prepare_model)
    prepare_optimizer = delegate("_preparer", Preparer.prepare_optimizer)
    prepare_scheduler = delegate("_preparer", Preparer.prepare_scheduler)
    prepare_data_loader = delegate("_preparer", Preparer.prepare_data_loader)

    def skip_first_batches(self, dataloader: DataLoader[object], num_batches: int = 0) -> DataLoader[object]:
        """Return a loader that starts ``num_batches`` batches into ``dataloader`` (O(1) for map-style data).

        Example:
            >>> resumed = accelerator.skip_first_batches(dataloader, num_batches=2)
            >>> len(resumed)  # the epoch's 4 batches less the 2 already seen
            2
        """
        from accelerando.data_loader import skip_first_batches

        return skip_first_batches(dataloader, num_batches=num_batches)

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """True when ``model`` (or a submodule) was dispatched over several devices with a device map.

        Example:
            >>> accelerator.verify_device_map(torch.nn.Linear(4, 2))  # True for a model dispatched with device_map
            False
        """
        return verify_device_map(model)

    def deepspeed_ulysses_dl_adapter(
        self, dl: DataLoader[object], model: torch.nn.Module
    ) -> Iterable[object]:
        """Wrap a prepared dataloader so that each sequence-parallel rank gets its slice of every batch.

        Raises:
            ValueError: no ``ParallelismConfig`` with ``sp_size > 1`` and ``sp_backend="deepspeed"``.
            ImportError / RuntimeError: DeepSpeed Ulysses is not installed / not set up.

        Example:
            >>> # with Accelerator(parallelism_config=ParallelismConfig(sp_size=2, sp_backend="deepspeed"), ...)
            >>> dataloader = accelerator.deepspeed_ulysses_dl_adapter(dataloader, model)  # doctest: +SKIP
        """
        return self._strategy.sequence_parallel_dataloader(dl, model)

    # --------------------------------------------------------------- training
    # kwargs go to torch's Tensor.backward or the strategy's engine (DeepSpeed's takes its own options).
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Back-propagate ``loss``: divided by the accumulation steps, scaled under fp16.

        Example:
            >>> batch, target = next(iter(dataloader))
            >>> loss = torch.nn.functional.mse_loss(model(batch), target)
            >>> accelerator.backward(loss)  # instead of loss.backward()
        """
        strategy = self._strategy
        steps = self.gradient_state._num_steps  # the attribute, not the property: a call per micro-batch
        if steps > 1 and not isinstance(strategy, ScalesLossForAccumulation):  # the engine divides it itself
            loss = loss / steps
        # The common case (a strategy and precision without their own backward) calls torch directly:
        # two Python-level calls fewer per micro-batch (tests/strategies/test_ddp_step_calls.py).
        if (
            type(strategy).backward is Strategy.backward
            and type(strategy.precision).backward is Precision.backward
        ):
            loss.backward(**kwargs)  # pyright: ignore[reportUnknownMemberType]
        else:
            strategy.backward(loss, **kwargs)

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

        Example:
            >>> for batch, target in dataloader:
            ...     with accelerator.accumulate(model):
            ...         loss = torch.nn.functional.mse_loss(model(batch), target)
            ...         accelerator.backward(loss)
            ...         optimizer.step()
            ...         optimizer.zero_grad()
        """
        return Accumulation(self, models)

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Context in which backward passes of ``model`` accumulate locally without all-reduce.

        Example:
            >>> with accelerator.no_sync(model):
            ...     accelerator.backward(model(torch.randn(2, 4)).sum())  # gradients stay local
            >>> accelerator.backward(model(torch.randn(2, 4)).sum())  # this one is averaged
        """
        with self._strategy.no_sync(model):
            yield

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """Context forcing the next backward of ``model`` to synchronise, even inside ``no_sync``.

        Example:
            >>> with accelerator.no_sync(model):
            ...     with accelerator.trigger_sync_in_backward(model):
            ...         accelerator.backward(model(torch.randn(2, 4)).sum())  # averaged after all
        """
        with self._strategy.trigger_sync_in_backward(model):
            yield

    @contextlib.contextmanager
    def join_uneven_inputs(
        self, joinables: list[Joinable], even_batches: bool | None = None
    ) -> Iterator[None]:
        """Context letting processes with fewer batches finish without hanging (DDP's Join).

        With ``even_batches`` given, the dataloaders prepared before the context use it for its
        duration (set on their batch samplers) and get their own value back on exit; loaders over
        iterable datasets cannot change it and are left alone with a warning.

        Example:
            >>> with accelerator.join_uneven_inputs([model], even_batches=False):
            ...     for batch, target in dataloader:
            ...         accelerator.backward(model(batch).sum())
        """
        overridden = override_even_batches(self._registry.dataloaders, even_batches)
        try:
            with self._strategy.join_uneven_inputs(joinables, even_batches):
                yield
        finally:
            for sampler, value in overridden:
                sampler.even_batches = value

    def unscale_gradients(
        self, optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None
    ) -> None:
        """Divide gradients by the fp16 loss scale (a no-op in other precisions).

        Example:
            >>> accelerator.backward(model(torch.randn(2, 4)).sum())
            >>> accelerator.unscale_gradients(optimizer)  # under fp16: the true gradients from here on
        """
        if self._precision.scaler is None or not self.gradient_state.sync_gradients:
            return
        targets = (
            self._registry.optimizers
            if optimizer is None
            else (optimizer if isinstance(optimizer, list) else [optimizer])
        )
        for opt in targets:
            self._precision.unscale_(getattr(opt, "optimizer", opt))

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2
    ) -> torch.Tensor:
        """Clip the gradient norm (unscaling fp16 gradients first); return the norm before clipping.

        Example:
            >>> accelerator.backward(model(torch.randn(2, 4)).sum())
            >>> if accelerator.sync_gradients:
            ...     norm = accelerator.clip_grad_norm_(model.parameters(), max_norm=1.0)
        """
        self.unscale_gradients()
        return self._strategy.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        """Clamp gradients into ``[-clip_value, clip_value]`` (unscaling fp16 gradients first).

        Example:
            >>> accelerator.backward(model(torch.randn(2, 4)).sum())
            >>> accelerator.clip_grad_value_(model.parameters(), clip_value=0.5)
        """
        self.unscale_gradients()
        self._strategy.clip_grad_value_(parameters, clip_value)

    def autocast(
        self, autocast_handler: AutocastKwargs | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """Context running its block in the mixed precision (an ``AutocastKwargs`` may tune it).

        Example:
            >>> with accelerator.autocast():
            ...     out = model(torch.randn(2, 4))  # in the mixed precision, if any
        """
        handler = autocast_handler or self.autocast_handler
        if handler is None:
            return self._precision.autocast()
        return self._precision.autocast(enabled=handler.enabled, cache_enabled=handler.cache_enabled)

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        """Backward and update in one pass for LOMO / AdaLomo optimizers.

        Raises:
            ValueError: no prepared optimizer is a LOMO optimizer.

        Example:
            >>> # with an optimizer from the lomo-optim package: lomo_optim.Lomo(model, lr=1e-3)
            >>> accelerator.lomo_backward(loss, learning_rate=1e-3)  # doctest: +SKIP
        """
        for opt in self._registry.optimizers:
            fused_backward = getattr(opt.optimizer, "fused_backward", None)
            if fused_backward is not None:
                fused_backward(loss, learning_rate)
                return
        raise ValueError(
            "lomo_backward needs a prepared LOMO or AdaLomo optimizer (from the lomo-optim package)"
        )

    def maybe_context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> contextlib.AbstractContextManager[None]:
        """Shard ``buffers`` along their sequence dims over the ``cp`` mesh axis for the block.

        A no-op unless the parallelism config has ``cp_size > 1``; then torch's context parallelism
        (CUDA attention kernels) runs inside the block.

        Raises:
            ValueError: ``cp_size > 1`` on a device other than CUDA (the message says why and the fix).

        Example:
            >>> inputs = torch.randn(2, 16, 4)  # (batch, sequence, features)
            >>> with accelerator.maybe_context_parallel(buffers=[inputs], buffer_seq_dims=[1]):
            ...     out = model(inputs)
        """
        return self._strategy.context_parallel(buffers, buffer_seq_dims, no_restore_buffers)

    # ------------------------------------------------------------------ models
    def unwrap_model(
        self, model: _Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> _Module:
        """Return the user's module inside DDP / FSDP / DeepSpeed / torch.compile wrappers.

        With ``keep_fp32_wrapper=False`` the mixed-precision forward wrapper is removed too. Typed as
        the type ``prepare`` gave the model back as: the user's own class.

        Example:
            >>> torch.save(accelerator.unwrap_model(model).state_dict(), "model.pt")  # doctest: +SKIP
        """
        inner = self._strategy.unwrap_model(
            model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile
        )
        return cast(_Module, inner)  # the user's module, of the type prepare() gave back

    def free_memory(self, *objects: object) -> list[None]:
        """Drop references to every prepared object, collect garbage and empty device caches.

        Returns ``objects`` replaced by Nones, to rebind: ``model, opt = accelerator.free_memory(model, opt)``.

        Example:
            >>> model, optimizer = accelerator.free_memory(model, optimizer)
            >>> model is None
            True
        """
        self._registry.clear()
        self.step = 0
        self._strategy.release()  # e.g. DeepSpeed engines hold buffers outside the prepared objects
        self._checkpoints.target.release_locks()  # another run may now save into this project folder
        gc.collect()
        self.state.device_backend.empty_cache()
        return [None for _ in objects]

    def clear(self, *objects: object) -> list[None]:
        """Alias of ``free_memory``.

        Example:
            >>> model, optimizer = accelerator.clear(model, optimizer)
        """
        return self.free_memory(*objects)

    # ------------------------------------------------------------ collectives
    gather = delegate("_collectives", Collectives.gather)
    gather_for_metrics = delegate("_collectives", Collectives.gather_for_metrics)
    reduce = delegate("_collectives", Collectives.reduce)
    pad_across_processes = delegate("_collectives", Collectives.pad_across_processes)
    split_between_processes = delegate("_collectives", Collectives.split_between_processes)
    wait_for_everyone = delegate("_collectives", Collectives.wait_for_everyone)
    set_trigger = delegate("_collectives", Collectives.set_trigger)
    check_trigger = delegate("_collectives", Collectives.check_trigger)
    print = delegate("_collectives", Collectives.print)
    main_process_first = delegate("_collectives", Collectives.main_process_first)
    local_main_process_first = delegate("_collectives", Collectives.local_main_process_first)

    # Each filter also works unbound on a function (``Accelerator.on_main_process(fn)``, the
    # reference's way of decorating its own methods) and called (``@accelerator.on_main_process()``).
    @overload
    def on_main_process(self, function: F) -> F: ...
    @overload
    def on_main_process(self, function: None = None) -> Callable[[F], F]: ...
    def on_main_process(self, function: F | None = None) -> F | Callable[[F], F]:
        """Decorator: run only on the main process (bare, called, or unbound on the class).

        Example:
            >>> @accelerator.on_main_process
            ... def report(message):
            ...     print(message)
            >>> report("once per job")
            once per job
        """
        return _filter(self, function, "on_main_process")

    @overload
    def on_local_main_process(self, function: F) -> F: ...
    @overload
    def on_local_main_process(self, function: None = None) -> Callable[[F], F]: ...
    def on_local_main_process(self, function: F | None = None) -> F | Callable[[F], F]:
        """Decorator: run only on each machine's first process (bare, called, or unbound).

        Example:
            >>> @accelerator.on_local_main_process
            ... def report(message):
            ...     print(message)
            >>> report("once per machine")
            once per machine
        """
        return _filter(self, function, "on_local_main_process")

    @overload
    def on_last_process(self, function: F) -> F: ...
    @overload
    def on_last_process(self, function: None = None) -> Callable[[F], F]: ...
    def on_last_process(self, function: F | None = None) -> F | Callable[[F], F]:
        """Decorator: run only on the last process (bare, called, or unbound).

        Example:
            >>> @accelerator.on_last_process
            ... def report(message):
            ...     print(message)
            >>> report("only on the last process")
            only on the last process
        """
        return _filter(self, function, "on_last_process")

    @overload
    def on_process(self, function: F, process_index: int | None = None) -> F: ...
    @overload
    def on_process(self, function: None = None, process_index: int | None = None) -> Callable[[F], F]: ...
    def on_process(self, function: F | None = None, process_index: int | None = None) -> F | Callable[[F], F]:
        """Decorator: run only on process ``process_index`` (``@accelerator.on_process(process_index=1)``).

        Example:
            >>> @accelerator.on_process(process_index=0)
            ... def report(message):
            ...     print(message)
            >>> report("only on process 0")
            only on process 0
        """
        return _filter(self, function, "on_process", process_index=process_index)

    @overload
    def on_local_process(self, function: F, local_process_index: int | None = None) -> F: ...
    @overload
    def on_local_process(
        self, function: None = None, local_process_index: int | None = None
    ) -> Callable[[F], F]: ...
    def on_local_process(
        self, function: F | None = None, local_process_index: int | None = None
    ) -> F | Callable[[F], F]:
        """Decorator: run only on local process ``local_process_index``.

        Example:
            >>> @accelerator.on_local_process(local_process_index=0)
            ... def report(message):
            ...     print(message)
            >>> report("on each machine's process 0")
            on each machine's process 0
        """
        return _filter(self, function, "on_local_process", local_process_index=local_process_index)

    # ----------------------------------------------------------- checkpoints
    get_state_dict = delegate("_checkpoints", CheckpointService.get_state_dict)
    save = delegate("_checkpoints", CheckpointService.save)
    save_model = delegate("_checkpoints", CheckpointService.save_model)
    register_for_checkpointing = delegate("_checkpoints", CheckpointService.register_for_checkpointing)
    register_save_state_pre_hook = delegate("_checkpoints", CheckpointService.register_save_state_pre_hook)
    register_load_state_pre_hook = delegate("_checkpoints", CheckpointService.register_load_state_pre_hook)
    save_state = delegate("_checkpoints", CheckpointService.save_state)
    load_state = delegate("_checkpoints", CheckpointService.load_state)

    # ------------------------------------------------------------- observing
    init_trackers = delegate("_observability", Observability.init_trackers)
    log = delegate("_observability", Observability.log)
    get_tracker = delegate("_observability", Observability.get_tracker)
    enable_memory_monitor = delegate("_observability", Observability.enable_memory_monitor)
    end_training = delegate("_observability", Observability.end_training)
    profile = delegate("_observability", Observability.profile)

    def __repr__(self) -> str:
        return (
            f"Accelerator(distributed_type={self.distributed_type}, num_processes={self.num_processes}, "
            f"device={self.device}, mixed_precision={self.mixed_precision})"
        )
