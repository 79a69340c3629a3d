"""The Runtime: everything the connector decided for this process, in one frozen record.

Two records, because a process can exist without an Accelerator (``PartialState()`` alone, or a
notebook launcher's child before it builds one):

- :class:`ProcessContext` answers "where am I": the cluster environment, the device family and
  device, and the default process group. It is made once per process (the first ``PartialState()``
  or ``Accelerator()``) and owns the process group's life: :func:`accelerando.core.process_group.start`
  registers the ordered teardown at exit.
- :class:`Runtime` adds what an ``Accelerator()`` decided: resolved settings, the device mesh, the
  distributed type, the precision, the backend plugins and, built last from all of these, the
  strategy.

The precision and the strategy are classes of layers above this one, so the Runtime names them by
the contracts the layers below use (:class:`PrecisionContract`, :class:`StrategyContract`);
``accelerando.backends.precision.base.Precision`` and ``accelerando.backends.strategies.base.Strategy`` satisfy them
(the connector, which builds the Runtime from them, is type-checked against these protocols).

Who writes what: only :mod:`accelerando.backends.connector` builds these records and calls :func:`activate`;
``PartialState`` / ``AcceleratorState`` are read-only views over them; the facade registers itself
with :func:`set_active_accelerator` (the one registry of "the Accelerator of this process", used by
the folder-only checkpoint functions).
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import InitVar
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from accelerando.core.devices import backend_for, detect_device_backend
from accelerando.core.enums import DistributedType
from accelerando.core.environments import detect_environment
from accelerando.core.records import entry, record
from accelerando.core.settings import environment_setting

if TYPE_CHECKING:
    import torch
    from torch.distributed.algorithms.join import Joinable
    from torch.distributed.device_mesh import DeviceMesh
    from torch.utils.data import DataLoader

    from accelerando.core.devices import DeviceBackend
    from accelerando.core.environments import ClusterEnvironment
    from accelerando.core.process_group import ProcessGroupHandle
    from accelerando.core.settings import Settings

HandlerT = TypeVar("HandlerT")

__all__ = [
    "Plugins",
    "PrecisionContract",
    "ProcessContext",
    "Runtime",
    "StrategyContract",
    "activate",
    "active_accelerator",
    "current",
    "current_process",
    "data_parallel_type",
    "forget",
    "set_active_accelerator",
    "set_process",
    "start_process",
]


@record
class ProcessContext:
    """Where this process runs: cluster environment, device, process group.

    Attributes:
        cluster: the detected cluster environment (rank, world size, main address...).
        device_backend: the hardware family class (``CPUBackend``, ``CUDABackend``...).
        device: the device this process computes on.
        distributed_type: the data-parallel type a plain job of this size reports (NO, MULTI_CPU...).
        process_group: the handle of the default process group (None in a single process).
        debug: whether collectives check that every process passes the same shapes.
    """

    cluster: ClusterEnvironment
    device_backend: type[DeviceBackend]
    device: torch.device
    distributed_type: DistributedType
    process_group: ProcessGroupHandle | None = None
    debug: bool = False

    @property
    def num_processes(self) -> int:
        """Total number of processes in the job."""
        return self.cluster.world_size

    @property
    def process_index(self) -> int:
        """Global rank of this process."""
        return self.cluster.rank

    @property
    def local_process_index(self) -> int:
        """Rank of this process on its machine."""
        return self.cluster.local_rank

    @property
    def num_nodes(self) -> int:
        """Number of machines (world size over processes per machine)."""
        return max(1, math.ceil(self.num_processes / max(self.cluster.local_world_size, 1)))

    @property
    def backend(self) -> str | None:
        """The process-group backend name (``"gloo"``, ``"nccl"``...), None in a single process."""
        return None if self.process_group is None else self.process_group.backend


@record
class Plugins:
    """The backend plugins and handlers in effect (given in code, or made from the settings).

    Attributes:
        deepspeed: name -> ``DeepSpeedPlugin`` (None without DeepSpeed).
        fsdp: the ``FullyShardedDataParallelPlugin`` (None without FSDP).
        megatron_lm: the ``MegatronLMPlugin`` (None without Megatron-LM).
        torch_tp: the ``TorchTensorParallelPlugin`` (None without tensor parallelism).
        parallelism_config: the ``ParallelismConfig`` (None without a mesh).
        dynamo: the ``TorchDynamoPlugin`` (always set; disabled without a backend).
        handlers: kwargs-handler class -> the instance given in code.
    """

    deepspeed: dict[str, Any] | None = None
    fsdp: Any = None
    megatron_lm: Any = None
    torch_tp: Any = None
    parallelism_config: Any = None
    dynamo: Any = None
    handlers: dict[type, object] = entry(default_factory=dict[type, object])

    def handler(self, kind: type[HandlerT]) -> HandlerT | None:
        """The kwargs handler of class ``kind`` given in code, or None.

        Raises:
            TypeError: the handler recorded under ``kind`` is not a ``kind`` (a wrongly built record).
        """
        found = self.handlers.get(kind)
        if found is None:
            return None
        if not isinstance(found, kind):
            raise TypeError(f"the handler recorded for {kind.__name__} is a {type(found).__name__}")
        return found


class PrecisionContract(Protocol):
    """What the layers below the precision package use of a precision (``precision.base.Precision``).

    Contract, in the order the Accelerator calls it: ``convert_module(model)`` once per model in
    ``prepare``; ``autocast()`` around user code on request; ``backward(loss)`` per micro-batch;
    ``unscale_(optimizer)`` before clipping; ``optimizer_step(optimizer)`` on sync steps (False =
    skipped by the loss scaler); ``state_dict()`` / ``load_state_dict()`` for checkpoints.
    """

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The loss scaler (a ``torch.amp.GradScaler`` of the device family), or None."""
        ...

    @property
    def name(self) -> str:
        """The mode: ``"no"``, ``"fp16"``, ``"bf16"``, ``"fp8"``."""
        ...

    def prepare_objects(
        self,
        objects: Sequence[object],
        placement: Sequence[bool],
        device: torch.device | None,
        is_prepared: Callable[[object], bool],
    ) -> list[object]:
        """Convert the objects of one ``prepare`` call that must change together (MS-AMP)."""
        ...

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """Prepare ``model`` for this precision."""
        ...

    def autocast(
        self, enabled: bool = True, cache_enabled: bool | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """Context manager running its block in this precision."""
        ...

    def backward(self, loss: torch.Tensor, **kwargs: object) -> None:
        """Back-propagate ``loss`` (scaled when a loss scaler is in use)."""
        ...

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by the loss scale."""
        ...

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: object) -> bool:
        """Step ``optimizer``; False when the loss scaler skipped the step."""
        ...

    def state_dict(self) -> Mapping[str, object]:
        """The loss scaler's state for checkpoints ({} without one)."""
        ...

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore what :meth:`state_dict` returned."""
        ...


class StrategyContract(Protocol):
    """What the layers below the strategies use of a strategy (``strategies.base.Strategy``).

    The full contract, with the calling order, is on ``Strategy``; this protocol names the members
    the Runtime promises. Records of the strategy layer (``PrepareRequest``, ``Prepared``) are
    typed there; here they pass as ``Any``. Each parameter type here is what the callers below the
    strategies pass (so ``Strategy``'s own may be wider); each return type, what they may rely on.
    """

    name: ClassVar[str]
    manages_precision: ClassVar[bool]
    divides_loss_for_accumulation: ClassVar[bool]
    plain_data_parallel: ClassVar[bool]
    loads_own_checkpoints: ClassVar[bool]

    @property
    def distributed_type(self) -> DistributedType:
        """What ``accelerator.distributed_type`` reports for this strategy."""
        ...

    def prepare_all(self, request: Any) -> object:
        """Prepare every object of one ``prepare`` call at once (a ``Prepared``), or None."""
        ...

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool = True, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Wrap ``model`` the strategy's way and return what the training loop calls."""
        ...

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Return the optimizer the strategy steps."""
        ...

    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> torch.nn.Module:
        """The user's module inside what ``prepare`` wrapped it in."""
        ...

    def backward(self, loss: torch.Tensor, **kwargs: object) -> None:
        """Back-propagate ``loss``."""
        ...

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Context in which backward passes do not communicate."""
        ...

    def trigger_sync_in_backward(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Context forcing the next backward to synchronise."""
        ...

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip the gradient norm; return the total norm before clipping."""
        ...

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        """Clamp every gradient element into ``[-clip_value, clip_value]``."""
        ...

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict of ``model``."""
        ...

    def load_model_state_dict(
        self, model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], strict: bool = True
    ) -> object:
        """Load a full state dict into ``model``."""
        ...

    def save_model_checkpoint(
        self, model: torch.nn.Module, output_dir: str, index: int, safe_serialization: bool
    ) -> bool:
        """Write ``model``'s checkpoint the strategy's own way; False = checkpointing's default."""
        ...

    def load_model_checkpoint(self, model: torch.nn.Module, input_dir: str, index: int) -> bool:
        """Load what ``save_model_checkpoint`` wrote; False = checkpointing's default."""
        ...

    def save_optimizer_checkpoint(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None, output_dir: str, index: int
    ) -> bool:
        """Write an optimizer's state the strategy's own way; False = checkpointing's default."""
        ...

    def load_optimizer_checkpoint(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None, input_dir: str, index: int
    ) -> bool:
        """Load what ``save_optimizer_checkpoint`` wrote; False = checkpointing's default."""
        ...

    def join_uneven_inputs(
        self, joinables: list[Joinable], even_batches: bool | None = None
    ) -> contextlib.AbstractContextManager[object]:
        """Context letting processes with fewer batches finish."""
        ...

    def context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> contextlib.AbstractContextManager[None]:
        """Context sharding ``buffers`` along their sequence dims over the ``cp`` mesh axis."""
        ...

    def sequence_parallel_dataloader(
        self, dataloader: DataLoader[object], model: torch.nn.Module
    ) -> Iterable[object]:
        """Wrap a prepared dataloader so that each sequence-parallel rank gets its slice."""
        ...


@record
class Runtime:
    """What the connector built for one ``Accelerator``: frozen once built.

    Built in one expression, in dependency order: every decided field first, then the strategy,
    made by ``make_strategy`` from the finished record (its constructor reads every field but
    ``strategy``, which does not exist until it returns). Nothing else sees the record before it
    is complete: the connector activates it afterwards. ``records.replace`` refuses to copy it
    (``make_strategy`` is required), so a strategy is never rebuilt by accident.

    Attributes:
        settings: the resolved settings, with the source of every value.
        process: the :class:`ProcessContext` (cluster, device, process group).
        mesh: the ``DeviceMesh`` of the job (from ``plugins.parallelism_config``, or the layout the
            chosen strategy makes itself, e.g. the pipeline's); None without one.
        distributed_type: what ``accelerator.distributed_type`` reports.
        precision: the precision instance (autocast, loss scaling).
        plugins: the :class:`Plugins` in effect.
        reason: why the connector chose this strategy (shown by ``--dry-run`` / debugging).
        strategy: the strategy instance (how models are wrapped, how processes talk).
    """

    settings: Settings
    process: ProcessContext
    mesh: DeviceMesh | None
    distributed_type: DistributedType
    precision: PrecisionContract
    plugins: Plugins
    reason: str
    make_strategy: InitVar[Callable[[Runtime], StrategyContract]]
    strategy: StrategyContract = entry(init=False, compare=False)

    def __post_init__(self, make_strategy: Callable[[Runtime], StrategyContract]) -> None:
        # Frozen: the one write, from inside the constructor, of the field that needs the record.
        object.__setattr__(self, "strategy", make_strategy(self))

    @property
    def cluster(self) -> ClusterEnvironment:
        """The cluster environment of this process."""
        return self.process.cluster

    @property
    def device(self) -> torch.device:
        """The device this process computes on."""
        return self.process.device

    @property
    def device_backend(self) -> type[DeviceBackend]:
        """The hardware family of this process's device."""
        return self.process.device_backend

    @property
    def num_processes(self) -> int:
        """Total number of processes in the job."""
        return self.process.num_processes

    @property
    def num_nodes(self) -> int:
        """Number of machines in the job."""
        return self.process.num_nodes

    @property
    def process_index(self) -> int:
        """Global rank of this process."""
        return self.process.process_index

    @property
    def is_main_process(self) -> bool:
        """Whether this is the process of global rank 0."""
        return self.process.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """Whether this is the first process on its machine."""
        return self.process.local_process_index == 0

    @property
    def mixed_precision(self) -> str:
        """The mixed-precision mode in effect (``"no"``, ``"fp16"``, ``"bf16"``, ``"fp8"``)."""
        return str(self.settings.mixed_precision or "no")


def data_parallel_type(device_backend: type[DeviceBackend], num_processes: int) -> DistributedType:
    """NO for one process, else the type the device family declares (MULTI_GPU on CUDA, ...)."""
    if num_processes <= 1:
        return DistributedType.NO
    return DistributedType(device_backend.data_parallel_type)


def start_process(settings: Settings, pg_options: Mapping[str, object] | None = None) -> ProcessContext:
    """Detect the cluster environment and device and start the process group; once per process.

    A second call returns the context the first one made (the process group exists once); asking
    for the CPU then, in a process already placed on an accelerator, is refused (as the reference
    does): the placement cannot change without ``_reset_state()``. The opposite order (CPU first,
    then ``cpu=False``) keeps the CPU silently, since ``cpu=False`` is the default.

    Args:
        settings: resolved settings (``cpu``, ``debug`` and ``enable_cpu_affinity`` are read).
        pg_options: ``backend`` / ``timeout`` overrides from ``InitProcessGroupKwargs``.

    The reference's variables read here: ``ACCELERATE_TORCH_DEVICE`` (the device to use instead of
    the detected one), ``ACCELERATE_DEBUG_RDV_FILE`` (a file rendezvous instead of TCP),
    ``ACCELERATE_ENABLE_RICH`` (rich tracebacks) and the SageMaker / TPU-pod switches (refused).

    Raises:
        ValueError: an explicit process-group backend the device cannot use; an unknown
            ``ACCELERATE_TORCH_DEVICE``; a SageMaker job or TPU pod (not supported); ``cpu`` asked
            for in a process already placed on an accelerator.
        TypeError: ``pg_options`` holds a backend that is not a str or a timeout that is not a
            ``datetime.timedelta``.
        RuntimeError: the rendezvous with the other processes failed (from torch.distributed).
    """
    existing = current_process()
    if existing is not None:
        refuse_cpu_switch(existing, bool(settings.cpu))
        return existing

    _refuse_unsupported_places()
    _install_rich_tracebacks()
    cluster = detect_environment()  # 1. who am I
    device_backend, device = _process_device(bool(settings.cpu), cluster.local_rank)  # 2. which hardware
    rdv_file = environment_setting("debug_rdv_file")
    handle = None
    if cluster.world_size > 1:  # 3. the process group, before the device is set (nccl binds it)
        import accelerando.core.process_group as process_group

        backend, timeout = _group_options(pg_options or {})
        handle = process_group.start(
            device=device,
            default_backend=device_backend.dist_backend,
            main_address=cluster.main_address,
            main_port=cluster.main_port,
            rank=cluster.rank,
            world_size=cluster.world_size,
            backend=backend,
            timeout=timeout,
            init_method=f"file://{rdv_file}" if rdv_file else None,
            attempt=cluster.restart_count,
            bind_address=settings.bind_address,
        )
    device_backend.set_device(device)
    if settings.enable_cpu_affinity and device.type == "cuda":
        from accelerando.core.devices.affinity import set_numa_affinity

        set_numa_affinity(cluster.local_rank, verbose=bool(settings.debug))
    context = ProcessContext(
        cluster=cluster,
        device_backend=device_backend,
        device=device,
        distributed_type=data_parallel_type(device_backend, cluster.world_size),
        process_group=handle,
        debug=bool(settings.debug),
    )
    set_process(context)
    return context


def _group_options(options: Mapping[str, object]) -> tuple[str | None, timedelta | None]:
    """The ``backend`` and ``timeout`` of ``options`` (None when absent).

    Raises:
        TypeError: a backend that is not a str, or a timeout that is not a ``datetime.timedelta``.
    """
    backend, timeout = options.get("backend"), options.get("timeout")
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"the process-group backend must be a str such as 'gloo', got {backend!r}")
    if timeout is not None and not isinstance(timeout, timedelta):
        raise TypeError(f"the process-group timeout must be a datetime.timedelta, got {timeout!r}")
    return backend, timeout


def _refuse_unsupported_places() -> None:
    """Refuse the reference's SageMaker and TPU-pod switches: those jobs are not supported here.

    Raises:
        ValueError: ``ACCELERATE_USE_SAGEMAKER`` or ``ACCELERATE_IN_TPU_POD`` is true.
    """
    for name, variable, what in (
        ("use_sagemaker", "ACCELERATE_USE_SAGEMAKER", "an Amazon SageMaker job"),
        ("in_tpu_pod", "ACCELERATE_IN_TPU_POD", "a TPU pod"),
    ):
        if environment_setting(name):
            raise ValueError(
                f"{variable} says this process runs in {what}, which accelerando does not support; "
                f"unset {variable} and run on this machine's CPUs/GPUs"
            )


def _process_device(cpu: bool, local_rank: int) -> tuple[type[DeviceBackend], torch.device]:
    """The device family and device of this process.

    ``ACCELERATE_TORCH_DEVICE`` (setting ``torch_device``, e.g. ``"cuda:1"``) names the device
    outright, as in the reference (it wins over ``cpu``); otherwise the first available family is
    used, CPU with ``cpu``, and the local rank picks the device.

    Raises:
        ValueError: ``ACCELERATE_TORCH_DEVICE`` is not a device torch knows, or of a family not
            supported here.
    """
    import torch

    wanted = environment_setting("torch_device")
    if not wanted:
        device_backend = detect_device_backend(cpu)
        return device_backend, device_backend.device(local_rank)
    try:
        device = torch.device(wanted)
    except RuntimeError as exc:
        raise ValueError(
            f"ACCELERATE_TORCH_DEVICE={wanted!r} is not a torch device; use e.g. 'cpu' or 'cuda:1'"
        ) from exc
    try:
        device_backend = backend_for(device.type)
    except ValueError as exc:
        raise ValueError(f"ACCELERATE_TORCH_DEVICE={wanted!r}: {exc}") from exc
    if device.type != "cpu" and not device_backend.is_available():
        raise ValueError(
            f"ACCELERATE_TORCH_DEVICE={wanted!r} names a {device.type} device, but none is available; "
            "unset it or name an available device"
        )
    return device_backend, device


def _install_rich_tracebacks() -> None:
    """With ``ACCELERATE_ENABLE_RICH`` true, show uncaught exceptions with rich (warns without rich)."""
    if not environment_setting("enable_rich"):
        return
    import importlib.util

    if importlib.util.find_spec("rich") is None:
        import warnings

        warnings.warn(
            "ACCELERATE_ENABLE_RICH is set but the rich package is not installed: pip install rich "
            "(tracebacks stay plain)",
            stacklevel=3,
        )
        return
    # What importing accelerando.utils.rich does; that module sits above this layer.
    from rich.traceback import install

    install(show_locals=False)


@record(frozen=False)
class _Registry:
    """The process's records. One module global on purpose: one process, one of each; tests reset it
    through ``forget``.
    """

    process: ProcessContext | None = None
    runtime: Runtime | None = None
    accelerator: weakref.ref[object] | None = None


_registry = _Registry()


def refuse_cpu_switch(context: ProcessContext, cpu: bool) -> None:
    """Refuse a request for the CPU once the process computes on an accelerator.

    Raises:
        ValueError: ``cpu`` is True and ``context.device`` is not the CPU.
    """
    if cpu and context.device.type != "cpu":
        raise ValueError(
            f"this process already computes on {context.device} (the first Accelerator or PartialState "
            "placed it), so cpu=True cannot be honoured now: pass cpu=True to the first one (or set "
            "ACCELERATE_USE_CPU=1 before it), or call AcceleratorState._reset_state(reset_partial_state=True) "
            "first"
        )


def current_process() -> ProcessContext | None:
    """The process context, or None before the first ``PartialState()`` / ``Accelerator()``."""
    return _registry.process


def set_process(context: ProcessContext) -> None:
    """Record the process context (the connector calls this once per process)."""
    _registry.process = context


def current() -> Runtime | None:
    """The Runtime of the newest ``Accelerator`` of this process, or None."""
    return _registry.runtime


def activate(runtime: Runtime) -> None:
    """Make ``runtime`` the one the state views read (the connector calls this after building it)."""
    _registry.runtime = runtime


def set_active_accelerator(accelerator: object) -> None:
    """Record ``accelerator`` as this process's active one (weakly: it may still be collected)."""
    _registry.accelerator = weakref.ref(accelerator)


def active_accelerator() -> Any:
    """The newest live ``Accelerator`` of this process, or None.

    Typed ``Any``: the ``Accelerator`` class lives in the facade, layers above this registry.
    """
    ref = _registry.accelerator
    return ref() if ref is not None else None


def forget(*, keep_process: bool = True) -> None:
    """Forget the Runtime and the active accelerator (and the process context unless ``keep_process``).

    Used by the state views' ``_reset_state`` (tests, notebooks). The process group itself is not
    torn down here: its teardown runs at exit, or through ``PartialState().destroy_process_group()``.
    """
    _registry.runtime = None
    _registry.accelerator = None
    if not keep_process:
        _registry.process = None
