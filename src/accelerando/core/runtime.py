"""The Runtime: everything the connector decided for this process, in one frozen record.

Two records, because a process can exist without an Accelerator (``PartialState()`` alone, or a
notebook launcher's child before it builds one):

- :class:`ProcessContext` answers "where am I": the cluster environment, the device family and
  device, and the default process group. It is made once per process (the first ``PartialState()``
  or ``Accelerator()``) and owns the process group's life: :func:`accelerando.core.process_group.start`
  registers the ordered teardown at exit.
- :class:`Runtime` adds what an ``Accelerator()`` decided: resolved settings, the device mesh, the
  distributed type, the backend plugins and the reason for the choice. It is data only: the
  connector builds the strategy and precision objects (classes of the layers above) from it and
  hands them beside it, so nothing here mirrors their surfaces.

Who writes what: only :mod:`accelerando.backends.connector` builds these records and calls :func:`activate`;
``PartialState`` / ``AcceleratorState`` are read-only views over them; the facade registers itself
with :func:`set_active_accelerator` (the one registry of "the Accelerator of this process", used by
the folder-only checkpoint functions).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from accelerando.core.devices import backend_for, detect_device_backend
from accelerando.core.enums import DistributedType
from accelerando.core.environments import detect_environment
from accelerando.core.settings import environment_setting

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from accelerando.core.devices import DeviceBackend
    from accelerando.core.environments import ClusterEnvironment
    from accelerando.core.process_group import ProcessGroupHandle
    from accelerando.core.settings import Settings

HandlerT = TypeVar("HandlerT")

__all__ = [
    "Plugins",
    "ProcessContext",
    "Runtime",
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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
    handlers: dict[type, object] = field(default_factory=dict[type, object])

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


@dataclass(frozen=True, slots=True)
class Runtime:
    """What the connector decided for one ``Accelerator``: plain data, frozen once built.

    The strategy and precision objects built from it are not part of it: the connector hands them
    beside it (``connector.Built``), and the Accelerator holds them. A lower layer that must call a
    strategy or precision declares the narrow Protocol it uses in its own module.

    Attributes:
        settings: the resolved settings, with the source of every value.
        process: the :class:`ProcessContext` (cluster, device, process group).
        mesh: the ``DeviceMesh`` of the job (from ``plugins.parallelism_config``, or the layout the
            chosen strategy makes itself, e.g. the pipeline's); None without one.
        distributed_type: what ``accelerator.distributed_type`` reports.
        plugins: the :class:`Plugins` in effect.
        reason: why the connector chose this strategy (shown by ``--dry-run`` / debugging).
    """

    settings: Settings
    process: ProcessContext
    mesh: DeviceMesh | None
    distributed_type: DistributedType
    plugins: Plugins
    reason: str

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


@dataclass(slots=True)
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
