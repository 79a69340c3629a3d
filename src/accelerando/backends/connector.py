"""Settings + plugins -> one :class:`~accelerando.core.runtime.Runtime`, in numbered steps.

This is the ONLY module that maps settings to a ``DistributedType`` or compares with one; strategies
declare the type they report. :func:`build` reads top to bottom:

1. cluster environment (torchrun, SLURM, MPI, single process) -- who am I, how many are we;
2. device (the hardware family and this process's device);
3. process group (several processes only; its teardown at exit is registered with it);
   steps 1-3 happen once per process (:func:`accelerando.core.runtime.start_process`, which a bare
   ``PartialState()`` calls too) and are shared by every later ``Accelerator``;
4. device mesh, from a ``ParallelismConfig`` (where tensor / pipeline / context parallelism plug in);
5. strategy rule (an explicit backend wins, else several processes mean DDP, else one device);
6. precision (fp32 / AMP fp16 with a loss scaler / bf16 / fp8);
7. instantiate: the Runtime record (data only), then the strategy from the finished record and the
   precision (strategies read no global state); activate the record, so ``AcceleratorState()`` views
   it, and hand the three back together (:class:`Built`).

Settings are resolved once per ``Accelerator`` by :func:`resolve_settings` (the environment part
once per process); plugins read the same process settings through ``settings.fill_unset``.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import accelerando.backends.strategies as strategies
import accelerando.core.runtime as rt
from accelerando.backends.precision import build_precision
from accelerando.backends.strategies.base import ManagesPrecision
from accelerando.core.devices import DeviceBackend
from accelerando.core.enums import DistributedType
from accelerando.core.settings import Settings, resolve_runtime_settings
from accelerando.plugins.dynamo import TorchDynamoPlugin

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from accelerando.backends.precision.base import Precision
    from accelerando.backends.strategies.base import Strategy
    from accelerando.parallelism_config import ParallelismConfig
    from accelerando.plugins.deepspeed import DeepSpeedPlugin
    from accelerando.plugins.kwargs import (
        AutocastKwargs,
        DistributedDataParallelKwargs,
        GradScalerKwargs,
        InitProcessGroupKwargs,
    )

__all__ = [
    "Built",
    "CodeHandlers",
    "Decision",
    "build",
    "code_handlers",
    "decide",
    "is_multi_device",
    "join_live_state",
    "normalise_deepspeed_plugins",
    "process_distributed_type",
    "resolve_settings",
]


def process_distributed_type(device_backend: type[DeviceBackend], num_processes: int) -> DistributedType:
    """The data-parallel type a plain job of ``num_processes`` on this device family reports."""
    return rt.data_parallel_type(device_backend, num_processes)


# Data-parallel types of several processes on accelerators (not CPUs, not a sharding backend).
_MULTI_DEVICE = frozenset(
    {
        DistributedType.MULTI_GPU,
        DistributedType.MULTI_NPU,
        DistributedType.MULTI_MLU,
        DistributedType.MULTI_SDAA,
        DistributedType.MULTI_MUSA,
        DistributedType.MULTI_XPU,
        DistributedType.MULTI_HPU,
        DistributedType.MULTI_NEURON,
    }
)


def is_multi_device(distributed_type: DistributedType) -> bool:
    """Whether ``distributed_type`` is plain data parallelism over several accelerator devices."""
    return distributed_type in _MULTI_DEVICE


@dataclass(frozen=True, slots=True)
class Built:
    """What :func:`build` makes for one Accelerator: the Runtime (data) and, beside it, the typed
    strategy and precision built from it (the Accelerator holds all three).
    """

    runtime: rt.Runtime
    strategy: Strategy
    precision: Precision


@dataclass(frozen=True, slots=True)
class Decision:
    """What the connector decided, with the reason for the strategy choice."""

    distributed_type: DistributedType
    strategy_name: str
    reason: str


def decide(
    *,
    num_processes: int,
    process_type: DistributedType,
    deepspeed_requested: bool,
    fsdp_requested: bool,
    megatron_requested: bool,
    requested_type: str | None,
    requested_type_source: str = "default",
    device_name: str = "cpu",
    pipeline_requested: bool = False,
    parallelism: ParallelismConfig | None = None,
    fault_tolerance_requested: bool = False,
) -> Decision:
    """Choose the distributed type and strategy (step 5).

    Steps: (0) a ``ParallelismConfig`` with ``tp_size > 1`` (or ``dp_shard_size > 1`` with HSDP
    replication, or without an FSDP plugin) means the composable strategy: tensor parallel, then
    FSDP2 on the mesh (reported as FSDP when it shards, else as the processes' data-parallel type);
    (1) an explicit backend plugin or launcher flag (DeepSpeed, FSDP, Megatron-LM) wins;
    (2) otherwise several processes mean DDP; (3) one process means the single-device strategy.
    A launcher request that cannot be honoured here (e.g. MULTI_GPU on a machine with no GPU) is an
    error naming where the request came from.

    Raises:
        ValueError: contradictory requests, with both sources named (e.g. tensor parallelism with
            DeepSpeed or Megatron-LM).
    """
    if requested_type in (DistributedType.MULTI_GPU.value,) and device_name != "cuda":
        raise ValueError(
            f"distributed_type=MULTI_GPU (from {requested_type_source}) but this machine has no usable GPU "
            f"(device detected: {device_name}); launch with --cpu / distributed_type: MULTI_CPU, "
            "or run on a GPU machine"
        )
    if fault_tolerance_requested:
        # FSDP with fault tolerance is HSDP: FSDP2 inside each replica group, torchft across groups.
        sharded = fsdp_requested and parallelism is not None and parallelism.dp_shard_enabled
        return _fault_tolerant_decision(
            process_type,
            deepspeed_requested
            or (fsdp_requested and not sharded)
            or megatron_requested
            or pipeline_requested,
            parallelism,
        )
    if pipeline_requested:
        return _pipeline_decision(
            process_type, num_processes, deepspeed_requested or fsdp_requested or megatron_requested
        )
    composable = _composable_decision(
        parallelism, process_type, deepspeed_requested, fsdp_requested, megatron_requested
    )
    if composable is not None:
        return composable
    if deepspeed_requested:
        return Decision(DistributedType.DEEPSPEED, "deepspeed", "a DeepSpeed plugin or --use_deepspeed")
    if fsdp_requested:
        return Decision(DistributedType.FSDP, "fsdp", "an FSDP plugin or --use_fsdp")
    if megatron_requested:
        return Decision(DistributedType.MEGATRON_LM, "megatron", "a Megatron-LM plugin or --use_megatron_lm")
    if process_type is not DistributedType.NO:
        return Decision(process_type, "ddp", f"{num_processes} processes")
    return Decision(DistributedType.NO, "single", "one process")


def _composable_decision(
    parallelism: ParallelismConfig | None,
    process_type: DistributedType,
    deepspeed_requested: bool,
    fsdp_requested: bool,
    megatron_requested: bool,
) -> Decision | None:
    """Step 5.0: the composable strategy for a mesh with tensor parallelism or FSDP2 sharding, else None."""
    if parallelism is None or not (parallelism.tp_enabled or parallelism.dp_shard_enabled):
        return None
    sizes = f"tp_size={parallelism.tp_size}, dp_shard_size={parallelism.dp_shard_size}"
    if deepspeed_requested:
        raise ValueError(
            f"ParallelismConfig({sizes}) lays the model out with DTensor / FSDP2, and DeepSpeed was requested too "
            "(a DeepSpeed plugin or --use_deepspeed); DeepSpeed ZeRO shards over every process itself: drop "
            "tp_size/dp_shard_size, or drop DeepSpeed"
        )
    if megatron_requested:
        raise ValueError(
            f"ParallelismConfig({sizes}) asks for torch-native tensor parallelism / FSDP2, and Megatron-LM was "
            "requested too; Megatron-LM splits the model itself (MegatronLMPlugin(tp_degree=...)): keep one"
        )
    if not parallelism.tp_enabled and fsdp_requested and not parallelism.dp_replicate_enabled:
        return None  # plain FSDP over every process: the FSDP strategy does it
    dims = " x ".join(
        f"{axis}={getattr(parallelism, f'{axis}_size')}" for axis in parallelism.active_mesh_dims
    )
    if parallelism.dp_shard_enabled:
        return Decision(DistributedType.FSDP, "composable", f"ParallelismConfig mesh {dims}")
    return Decision(process_type, "composable", f"ParallelismConfig mesh {dims}")


def _fold_tensor_parallel_plugin(plugins: rt.Plugins, num_processes: int) -> rt.Plugins:
    """A ``TorchTensorParallelPlugin`` with ``tp_size > 1`` as the ParallelismConfig it stands for.

    Raises:
        ValueError: the plugin and a ParallelismConfig disagree on the tensor-parallel degree.
    """
    plugin = plugins.torch_tp
    if plugin is None or plugin.tp_size <= 1:
        return plugins
    config = plugins.parallelism_config
    if config is not None:
        if config.tp_size != plugin.tp_size:
            raise ValueError(
                f"TorchTensorParallelPlugin(tp_size={plugin.tp_size}) and ParallelismConfig(tp_size={config.tp_size}) "
                "disagree; give the degree once (ParallelismConfig(tp_size=...))"
            )
        return plugins

    # Deferred: the ParallelismConfig dataclass loads only when a mesh is asked for.
    from accelerando.parallelism_config import ParallelismConfig

    return dataclasses.replace(
        plugins, parallelism_config=ParallelismConfig(**plugin.parallelism_sizes(num_processes))
    )


def _pipeline_decision(process_type: DistributedType, num_processes: int, other_backend: bool) -> Decision:
    """Step 5 for a ``PipelineParallelPlugin``: the pipeline strategy, alone (accelerando-specific)."""
    if other_backend:
        raise ValueError(
            "a PipelineParallelPlugin and DeepSpeed / FSDP / Megatron-LM were both requested; pipeline parallelism "
            "here runs on its own: drop one of them"
        )
    return Decision(process_type, "pipeline", f"a PipelineParallelPlugin over {num_processes} processes")


def _fault_tolerant_decision(
    process_type: DistributedType, other_backend: bool, parallelism: ParallelismConfig | None
) -> Decision:
    """Step 5 for ``--fault_tolerance`` / a ``FaultTolerancePlugin``: torchft data parallelism across groups.

    A ParallelismConfig may describe the replica axis (``dp_replicate_size``, the replica groups) and
    FSDP2 sharding inside a group (``dp_shard_size``: HSDP); nothing else.

    Raises:
        ValueError: another backend was requested too (FSDP only with ``dp_shard_size``), or the
            ParallelismConfig splits the model (tensor / context / sequence parallelism).
    """
    if other_backend:
        raise ValueError(
            "fault tolerance (--fault_tolerance or a FaultTolerancePlugin) and DeepSpeed / FSDP / Megatron-LM / "
            "pipeline parallelism were both requested; fault tolerance here is torchft's data parallelism across "
            "replica groups, on its own, or HSDP (--use_fsdp --fsdp_version 2 with --parallelism_config_dp_shard_size "
            "= processes per group): drop the other backend"
        )
    if parallelism is not None and (
        parallelism.tp_enabled or parallelism.cp_enabled or parallelism.sp_enabled
    ):
        raise ValueError(
            f"fault tolerance replicates the model across replica groups (and may shard it inside a group with "
            f"dp_shard_size), and {parallelism!r} also splits it (tensor / context / sequence parallelism, not "
            "supported with torchft yet): keep only dp_replicate_size and dp_shard_size"
        )
    return Decision(process_type, "fault_tolerant", "fault tolerance (torchft) across replica groups")


# ----------------------------------------------------------------------------------- step 0
def resolve_settings(code: Mapping[str, object] | None = None) -> Settings:
    """Resolve an Accelerator's settings: defaults < environment (once per process) < code.

    Raises:
        ValueError: a value that is not allowed (the message names the setting, its source and the fix).
    """
    return resolve_runtime_settings(code=code)


def join_live_state(code: Mapping[str, object]) -> dict[str, object]:
    """The code settings of a new Accelerator, agreed with the process-wide state already in effect.

    As in the reference, a process has one mixed-precision mode until
    ``AcceleratorState._reset_state()``: while an earlier Accelerator's Runtime is the active one,
    a new Accelerator that leaves ``mixed_precision`` unset takes that mode, and one that asks for
    another is refused (each Accelerator then answers from its own Runtime, which is why the process
    view, free functions and transformers stay consistent with every live Accelerator).

    Raises:
        ValueError: ``mixed_precision`` differs from the mode in effect (the reference's message,
            with the mode in effect and how to change it).
    """
    live = rt.current()
    if live is None:
        return dict(code)
    held, wanted = live.mixed_precision, code.get("mixed_precision")
    if wanted is None:
        return {**code, "mixed_precision": held}
    if str(wanted).lower() != held:
        raise ValueError(
            "AcceleratorState has already been initialized and cannot be changed, restart your runtime "
            f"completely and pass `mixed_precision='{wanted}'` to `Accelerator()`. (The Accelerator "
            f"already built in this process uses mixed_precision={held!r}; to build one with another "
            "mode in the same process, call AcceleratorState._reset_state() first.)"
        )
    return dict(code)


# ------------------------------------------------------------------------------------ step 4
def _build_mesh(
    parallelism_config: ParallelismConfig | None, process: rt.ProcessContext
) -> DeviceMesh | None:
    """Step 4: the ``DeviceMesh`` of a ParallelismConfig (None without one or without an active axis)."""
    if parallelism_config is None:
        return None
    if parallelism_config.sp_enabled:
        raise NotImplementedError(
            f"ParallelismConfig(sp_size={parallelism_config.sp_size}) asks for sequence parallelism, which runs "
            "on DeepSpeed Ulysses (deepspeed>=0.18.2, on GPUs); accelerando does not set Ulysses up yet: use "
            "sp_size=1"
        )
    parallelism_config.validate(process.num_processes)
    return parallelism_config.get_device_mesh(process.device.type)


# ------------------------------------------------------------------------------------ step 5
def normalise_deepspeed_plugins(
    deepspeed_plugin: DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None,
    deepspeed_plugins: dict[str, DeepSpeedPlugin] | None,
) -> dict[str, DeepSpeedPlugin] | None:
    """One ``name -> DeepSpeedPlugin`` dict from the two ways of passing them (or None).

    Raises:
        ValueError: both ways were used.
    """
    if deepspeed_plugin is not None and deepspeed_plugins is not None:
        raise ValueError("pass either deepspeed_plugin or deepspeed_plugins, not both")
    if deepspeed_plugin is not None:
        return deepspeed_plugin if isinstance(deepspeed_plugin, dict) else {"default": deepspeed_plugin}
    return deepspeed_plugins


def _strategy_rule(settings: Settings, plugins: rt.Plugins, process: rt.ProcessContext) -> Decision:
    return decide(
        num_processes=process.num_processes,
        process_type=process.distributed_type,
        deepspeed_requested=plugins.deepspeed is not None or bool(settings.use_deepspeed),
        fsdp_requested=plugins.fsdp is not None or bool(settings.use_fsdp),
        megatron_requested=plugins.megatron_lm is not None or bool(settings.use_megatron_lm),
        requested_type=settings.distributed_type,
        requested_type_source=settings.source("distributed_type"),
        device_name=process.device.type,
        pipeline_requested=_pipeline_requested(plugins),
        parallelism=plugins.parallelism_config,
        fault_tolerance_requested=_fault_tolerance_requested(settings, plugins),
    )


def _handler_given(plugins: rt.Plugins, module: str, name: str) -> bool:
    """Whether a handler of class ``module.name`` was given, without importing ``module`` when none was.

    An instance exists only once its class's module is imported, so an unloaded module means no such
    handler: the fault-tolerance and pipeline plugin modules (and their dataclasses) stay off the
    first-Accelerator path (tests/runtime/test_first_accelerator_modules.py).
    """
    loaded = sys.modules.get(module)
    if loaded is None:
        return False
    kind: type[object] = getattr(loaded, name)
    return plugins.handler(kind) is not None


def _fault_tolerance_requested(settings: Settings, plugins: rt.Plugins) -> bool:

    return bool(settings.fault_tolerance) or _handler_given(
        plugins, "accelerando.plugins.fault_tolerance", "FaultTolerancePlugin"
    )


def _pipeline_requested(plugins: rt.Plugins) -> bool:

    return _handler_given(plugins, "accelerando.plugins.pipeline", "PipelineParallelPlugin")


def _default_backend_plugins(decision: Decision, plugins: rt.Plugins) -> rt.Plugins:
    """The chosen backend's plugin, made from the settings when the user passed none."""
    if decision.distributed_type is DistributedType.FSDP and plugins.fsdp is None:
        from accelerando.plugins.fsdp import FullyShardedDataParallelPlugin

        return dataclasses.replace(plugins, fsdp=FullyShardedDataParallelPlugin())
    if decision.distributed_type is DistributedType.DEEPSPEED and plugins.deepspeed is None:
        from accelerando.plugins.deepspeed import DeepSpeedPlugin

        return dataclasses.replace(plugins, deepspeed={"default": DeepSpeedPlugin()})
    return plugins


@dataclass(frozen=True, slots=True)
class CodeHandlers:
    """The kwargs handlers given in code that the connector reads (None where not given)."""

    init: InitProcessGroupKwargs | None = None
    scaler: GradScalerKwargs | None = None
    autocast: AutocastKwargs | None = None
    ddp: DistributedDataParallelKwargs | None = None


def code_handlers(plugins: rt.Plugins) -> CodeHandlers:
    """The process-group, scaler, autocast and DDP handlers among ``plugins.handlers``.

    Raises:
        TypeError: a handler is recorded under a class it is not an instance of.
    """
    if not plugins.handlers:
        return CodeHandlers()
    # Deferred: the handler classes (five dataclasses) load only once a script has built one.
    from accelerando.plugins import kwargs

    return CodeHandlers(
        init=plugins.handler(kwargs.InitProcessGroupKwargs),
        scaler=plugins.handler(kwargs.GradScalerKwargs),
        autocast=plugins.handler(kwargs.AutocastKwargs),
        ddp=plugins.handler(kwargs.DistributedDataParallelKwargs),
    )


# ------------------------------------------------------------------------------------ step 6
def _build_precision(
    settings: Settings, plugins: rt.Plugins, handlers: CodeHandlers, device_type: str, loss_scaling: bool
) -> Precision:

    scaler, autocast = handlers.scaler, handlers.autocast
    scaler_kwargs: dict[str, object] = scaler.scaler_kwargs() if scaler is not None else {}
    return build_precision(
        settings.mixed_precision,
        device_type,
        scaler_kwargs,
        bool(scaler.static_scale) if scaler is not None else False,
        autocast.to_kwargs() if autocast is not None else None,
        loss_scaling=loss_scaling,
        handlers=plugins.handlers,
        settings=settings,
    )


def _dynamo_plugin(settings: Settings, plugin: TorchDynamoPlugin | None) -> TorchDynamoPlugin:
    if plugin is not None:
        return plugin

    return TorchDynamoPlugin(
        backend=settings.dynamo_backend,
        mode=settings.dynamo_mode,
        fullgraph=settings.dynamo_use_fullgraph,
        dynamic=settings.dynamo_use_dynamic,
    )


# ------------------------------------------------------------------------------------- build
def build(settings: Settings, plugins: rt.Plugins) -> Built:
    """Turn resolved settings and the user's plugins into the Runtime, strategy and precision (steps 1-7).

    The Runtime is built whole before anything sees it; the strategy then receives the record and
    the precision by constructor (it reads no global state); only then is the record activated.

    Args:
        settings: from :func:`resolve_settings`.
        plugins: the plugins and kwargs handlers given in code (``deepspeed`` already normalised by
            :func:`normalise_deepspeed_plugins`).

    Returns:
        The :class:`Built` record: the frozen Runtime (also made the active one, which
        ``AcceleratorState()`` views), the strategy and the precision.

    Raises:
        ValueError: contradictory requests or a bad mesh, naming where each value came from.
        NotImplementedError: a backend or precision this version cannot run.
    """
    handlers = code_handlers(plugins)
    init_handler = handlers.init
    # 1-3. cluster environment, device, process group: once per process, shared by later Accelerators
    process = rt.start_process(settings, init_handler.to_kwargs() if init_handler is not None else {})
    plugins = _fold_tensor_parallel_plugin(plugins, process.num_processes)
    # 4. the mesh of a ParallelismConfig; with a PipelineParallelPlugin the pipeline strategy lays the
    # processes out itself (step 5) and checks the ParallelismConfig against its layout.
    # With fault tolerance the replicate axis is the replica groups, each its own job: no mesh inside a group.
    own_layout = _pipeline_requested(plugins) or _fault_tolerance_requested(settings, plugins)
    mesh = None if own_layout else _build_mesh(plugins.parallelism_config, process)
    decision = _strategy_rule(settings, plugins, process)
    plugins = _default_backend_plugins(decision, plugins)
    plugins = dataclasses.replace(plugins, dynamo=_dynamo_plugin(settings, plugins.dynamo))
    strategy_cls = strategies.strategy_class(decision.strategy_name)
    if mesh is None:
        # A strategy that lays the processes out itself (the pipeline's ("dp_replicate", "pp") mesh) makes
        # the runtime's mesh: data sharding, gather_for_metrics and the rank properties read it there.
        mesh = strategy_cls.own_mesh(plugins, process)
    # 6. A strategy whose engine scales the loss itself (DeepSpeed) keeps autocast but gets no scaler.
    precision = _build_precision(
        settings,
        plugins,
        handlers,
        process.device.type,
        loss_scaling=not issubclass(strategy_cls, ManagesPrecision),
    )
    # 7. instantiate: the Runtime record (data only), then the strategy from it, then activate the record
    runtime = rt.Runtime(
        settings=settings,
        process=process,
        mesh=mesh,
        distributed_type=decision.distributed_type,
        plugins=plugins,
        reason=decision.reason,
    )
    strategy = strategy_cls(runtime, precision, ddp_kwargs=handlers.ddp)
    rt.activate(runtime)
    return Built(runtime, strategy, precision)
